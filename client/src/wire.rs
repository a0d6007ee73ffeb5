//! The client's side of the wire: the messages it sends for a placed parameter
//! part, its chunk streams, and the pulled tensors put back together.

use std::collections::BTreeMap;

use bytes::Bytes;
use ps_proto::chunk::{Assembler, ChunkError, ChunkHeader, to_wire_chunks};
use ps_proto::codec::{CodecError, TensorData, wire_shape};
use ps_proto::ids::{MapVersion, Version};
use ps_proto::key::ParamKey;
use ps_proto::v1;

use crate::error::ClientError;
use crate::placement::{Part, Placed};

/// A part of a parameter and the bytes it carries.
pub(crate) type PartData<'a> = (&'a Placed, Part, Bytes);

/// A reply that does not fit the protocol.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MalformedReply {
    /// A required field is absent.
    #[error("{0}")]
    Missing(&'static str),
    /// A tensor does not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// Chunks do not assemble.
    #[error(transparent)]
    Chunk(#[from] ChunkError),
}

/// One pulled key's values and their version.
#[derive(Debug)]
pub(crate) struct PulledKey {
    /// The key.
    pub key: ParamKey,
    /// Its values.
    pub data: TensorData,
    /// Their version.
    pub version: Version,
}

/// A parameter's values as pulled, reassembled from its parts.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledParam {
    /// All elements, row-major.
    pub values: Vec<f32>,
    /// The lowest version among its parts.
    pub version: Version,
}

/// The spec a part is registered with: its own shape, and the whole shape when
/// the parameter is partitioned.
pub(crate) fn spec_of(
    placed: &Placed,
    part: &Part,
    optimizer: &v1::Optimizer,
) -> v1::ParameterSpec {
    v1::ParameterSpec {
        name: placed.info.name.clone(),
        part: part.part,
        dtype: placed.info.dtype.to_proto(),
        shape: wire_shape(&placed.part_shape(part)),
        optimizer: Some(*optimizer),
        whole_shape: if placed.parts.len() > 1 {
            wire_shape(&placed.info.shape)
        } else {
            Vec::new()
        },
    }
}

/// A part's bytes as a tensor message.
pub(crate) fn tensor_of(placed: &Placed, part: &Part, data: Bytes) -> v1::Tensor {
    v1::Tensor {
        name: placed.info.name.clone(),
        part: part.part,
        dtype: placed.info.dtype.to_proto(),
        shape: wire_shape(&placed.part_shape(part)),
        data,
    }
}

fn header_of(name: &str, part: u32, dtype: i32, shape: &[u64]) -> ChunkHeader {
    ChunkHeader::from_wire(name, part, dtype, shape).expect("headers built from a valid placement")
}

/// A tensor cut into stream chunks of `chunk_bytes`.
pub(crate) fn tensor_chunks(tensor: &v1::Tensor, chunk_bytes: usize) -> Vec<v1::TensorChunk> {
    let header = header_of(&tensor.name, tensor.part, tensor.dtype, &tensor.shape);
    to_wire_chunks(&header, &tensor.data, chunk_bytes)
}

/// A registration cut into stream chunks of `chunk_bytes`, each carrying the
/// map version and restore version.
pub(crate) fn register_chunks(
    spec: &v1::ParameterSpec,
    data: &Bytes,
    chunk_bytes: usize,
    (map_version, restore_version): (MapVersion, Version),
) -> Vec<v1::RegisterChunk> {
    let header = header_of(&spec.name, spec.part, spec.dtype, &spec.shape);
    to_wire_chunks(&header, data, chunk_bytes)
        .into_iter()
        .map(|chunk| v1::RegisterChunk {
            map_version: map_version.get(),
            restore_version: restore_version.get(),
            spec: Some(spec.clone()),
            offset: chunk.offset,
            data: chunk.data,
        })
        .collect()
}

/// A unary pull's tensor, checked.
pub(crate) fn decode_pulled(pulled: &v1::PulledTensor) -> Result<PulledKey, MalformedReply> {
    let tensor = pulled
        .tensor
        .as_ref()
        .ok_or(MalformedReply::Missing("a PulledTensor without a tensor"))?;
    Ok(PulledKey {
        key: ParamKey::new(&tensor.name, tensor.part),
        data: TensorData::from_proto(tensor)?,
        version: Version(pulled.version),
    })
}

/// A streamed pull's chunks, assembled and checked.
pub(crate) fn assemble_pulled(
    chunks: Vec<v1::PullChunk>,
) -> Result<Vec<PulledKey>, MalformedReply> {
    let mut assembler = Assembler::new();
    let mut versions = BTreeMap::new();
    for message in chunks {
        let chunk = message
            .chunk
            .ok_or(MalformedReply::Missing("a PullChunk without a chunk"))?;
        versions.insert(ParamKey::new(&chunk.name, chunk.part), message.version);
        assembler.add_chunk(&chunk)?;
    }
    Ok(assembler
        .finish()?
        .into_iter()
        .map(|(key, data)| {
            let version = Version(versions[&key]);
            PulledKey { key, data, version }
        })
        .collect())
}

/// A parameter put back together from its pulled parts.
pub(crate) fn reassemble(
    placed: &Placed,
    pulled: &BTreeMap<ParamKey, PulledKey>,
) -> Result<PulledParam, ClientError> {
    // Parts in order of their first element, appended one after the other: the
    // destination is written once, never zero-filled first.
    let mut parts: Vec<&Part> = placed.parts.iter().collect();
    parts.sort_by_key(|part| part.start);
    let mut values = Vec::with_capacity(placed.info.len());
    let mut version = Version(u64::MAX);
    for part in parts {
        let key = ParamKey::new(&placed.info.name, part.part);
        let PulledKey {
            data,
            version: part_version,
            ..
        } = pulled
            .get(&key)
            .ok_or_else(|| ClientError::Usage(format!("no values came back for {key}")))?;
        if data.len() != part.len {
            return Err(ClientError::Usage(format!(
                "{key} came back with {} elements, expected {}",
                data.len(),
                part.len
            )));
        }
        if part.start != values.len() {
            return Err(ClientError::Usage(format!(
                "{key} starts at element {}, but the parts before it end at {}",
                part.start,
                values.len()
            )));
        }
        data.for_each_f32_block(|_, block| values.extend_from_slice(block));
        version = version.min(*part_version);
    }
    if values.len() != placed.info.len() {
        return Err(ClientError::Usage(format!(
            "the parts of `{}` hold {} of its {} elements",
            placed.info.name,
            values.len(),
            placed.info.len()
        )));
    }
    Ok(PulledParam {
        values,
        version: if version == Version(u64::MAX) {
            Version(0)
        } else {
            version
        },
    })
}
