//! The client's side of the wire: the messages it sends for a placed parameter
//! part, its chunk streams, and the pulled tensors put back together.

use std::collections::BTreeMap;

use bytes::Bytes;
use ps_proto::chunk::{Assembler, ChunkHeader, to_wire_chunks};
use ps_proto::codec::{TensorData, wire_shape};
use ps_proto::key::ParamKey;
use ps_proto::v1;

use crate::error::ClientError;
use crate::placement::{Part, Placed};

/// A part of a parameter and the bytes it carries.
pub(crate) type PartData<'a> = (&'a Placed, Part, Bytes);

/// One pulled key's values and their version.
pub(crate) type PulledKey = (ParamKey, (TensorData, u64));

/// A parameter's values as pulled, reassembled from its parts.
#[derive(Debug, Clone, PartialEq)]
pub struct PulledParam {
    /// All elements, row-major.
    pub values: Vec<f32>,
    /// The lowest version among its parts.
    pub version: u64,
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
    (map_version, restore_version): (u64, u64),
) -> Vec<v1::RegisterChunk> {
    let header = header_of(&spec.name, spec.part, spec.dtype, &spec.shape);
    to_wire_chunks(&header, data, chunk_bytes)
        .into_iter()
        .map(|chunk| v1::RegisterChunk {
            map_version,
            restore_version,
            spec: Some(spec.clone()),
            offset: chunk.offset,
            data: chunk.data,
        })
        .collect()
}

/// A unary pull's tensor, checked.
pub(crate) fn decode_pulled(pulled: &v1::PulledTensor) -> Result<PulledKey, String> {
    let tensor = pulled
        .tensor
        .as_ref()
        .ok_or("a PulledTensor without a tensor")?;
    let data = TensorData::from_proto(tensor).map_err(|e| e.to_string())?;
    Ok((
        ParamKey::new(&tensor.name, tensor.part),
        (data, pulled.version),
    ))
}

/// A streamed pull's chunks, assembled and checked.
pub(crate) fn assemble_pulled(chunks: Vec<v1::PullChunk>) -> Result<Vec<PulledKey>, String> {
    let mut assembler = Assembler::new();
    let mut versions = BTreeMap::new();
    for message in chunks {
        let chunk = message.chunk.ok_or("a PullChunk without a chunk")?;
        versions.insert(ParamKey::new(&chunk.name, chunk.part), message.version);
        assembler.add_chunk(&chunk).map_err(|e| e.to_string())?;
    }
    let tensors = assembler.finish().map_err(|e| e.to_string())?;
    Ok(tensors
        .into_iter()
        .map(|(key, data)| {
            let version = versions[&key];
            (key, (data, version))
        })
        .collect())
}

/// A parameter put back together from its pulled parts.
pub(crate) fn reassemble(
    placed: &Placed,
    pulled: &BTreeMap<ParamKey, (TensorData, u64)>,
) -> Result<PulledParam, ClientError> {
    let mut values = vec![0f32; placed.info.len()];
    let mut version = u64::MAX;
    for part in &placed.parts {
        let key = ParamKey::new(&placed.info.name, part.part);
        let (data, part_version) = pulled
            .get(&key)
            .ok_or_else(|| ClientError::Usage(format!("no values came back for {key}")))?;
        if data.len() != part.len {
            return Err(ClientError::Usage(format!(
                "{key} came back with {} elements, expected {}",
                data.len(),
                part.len
            )));
        }
        let target = &mut values[part.start..part.start + part.len];
        data.for_each_f32_block(|start, block| {
            target[start..start + block.len()].copy_from_slice(block)
        });
        version = version.min(*part_version);
    }
    Ok(PulledParam {
        values,
        version: if version == u64::MAX { 0 } else { version },
    })
}
