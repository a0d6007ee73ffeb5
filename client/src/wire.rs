//! The client's side of the wire: the messages it sends for a placed parameter
//! part, its chunk streams, and the pulled tensors put back together.

use std::collections::BTreeMap;

use bytes::Bytes;
use ps_proto::chunk::{ChunkCursor, ChunkError, to_wire_chunks, whole_elements};
use ps_proto::chunk_decode::FieldError;
use ps_proto::codec::{CodecError, DType, TensorData, wire_shape};
use ps_proto::header::TensorHeader;
use ps_proto::ids::{MapVersion, Version};
use ps_proto::key::ParamKey;
use ps_proto::v1;
use ps_shm::LentPayloads;
use ps_shm::arena::ArenaView;

#[cfg(test)]
use crate::placement::ParamInfo;
use crate::placement::{Part, Placed, Placement};

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
    /// A tensor that was not asked for.
    #[error("{0} came back, but it was not asked for")]
    Unasked(ParamKey),
    /// A chunk message that does not decode.
    #[error(transparent)]
    Fields(#[from] FieldError),
    /// A whole answer that does not decode.
    #[error("the answer does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// One parameter's values or gradient, by name, as bytes in its wire dtype:
/// what a worker registers and pushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamBytes {
    /// The parameter's name.
    pub name: String,
    /// Every element, row-major, in the parameter's wire dtype.
    pub data: Bytes,
}

impl ParamBytes {
    /// `data` as the bytes of the parameter `name`.
    pub fn new(name: impl Into<String>, data: Bytes) -> Self {
        Self {
            name: name.into(),
            data,
        }
    }
}

/// A parameter's values as pulled, reassembled from its parts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PulledParam {
    /// All elements, row-major.
    pub values: Vec<f32>,
    /// The lowest version among its parts.
    pub version: Version,
}

/// A part as it is registered: its header, the spec it is registered with
/// (its own shape, and the whole shape when the parameter is partitioned) and
/// its initial values.
pub(crate) struct PartInit {
    header: TensorHeader,
    spec: v1::ParameterSpec,
    data: Bytes,
}

impl PartInit {
    /// The registration of `part` of `placed` with `optimizer`, starting at `data`.
    pub(crate) fn new(
        placed: &Placed,
        part: &Part,
        optimizer: &v1::Optimizer,
        data: Bytes,
    ) -> Self {
        let header = placed.header(part);
        let spec = v1::ParameterSpec {
            name: header.key.name.clone(),
            part: header.key.part,
            dtype: header.dtype.to_proto(),
            shape: header.wire_shape(),
            optimizer: Some(*optimizer),
            whole_shape: if placed.parts.len() > 1 {
                wire_shape(&placed.info.shape)
            } else {
                Vec::new()
            },
        };
        Self { header, spec, data }
    }

    /// Bytes of initial values.
    pub(crate) fn byte_len(&self) -> usize {
        self.data.len()
    }

    /// The registration as one message of a unary `Register`.
    pub(crate) fn message(&self) -> v1::ParameterInit {
        v1::ParameterInit {
            spec: Some(self.spec.clone()),
            initial: self.data.clone(),
        }
    }

    /// The registration cut into stream chunks of `chunk_bytes`, each carrying
    /// the map version and restore version.
    pub(crate) fn chunks(
        &self,
        chunk_bytes: usize,
        (map_version, restore_version): (MapVersion, Version),
    ) -> impl Iterator<Item = v1::RegisterChunk> + '_ {
        to_wire_chunks(&self.header, &self.data, chunk_bytes)
            .into_iter()
            .map(move |chunk| v1::RegisterChunk {
                map_version: map_version.get(),
                restore_version: restore_version.get(),
                spec: Some(self.spec.clone()),
                offset: chunk.offset,
                data: chunk.data,
            })
    }
}

/// A part's gradient: its header and bytes, sent whole as a `Tensor` or cut
/// into chunks.
pub(crate) type PartGrad = (TensorHeader, Bytes);

/// The gradient of `part` of `placed`.
pub(crate) fn part_grad((placed, part, data): &PartData<'_>) -> PartGrad {
    (placed.header(part), data.clone())
}

/// A gradient cut into stream chunks of `chunk_bytes`.
pub(crate) fn grad_chunks((header, data): &PartGrad, chunk_bytes: usize) -> Vec<v1::TensorChunk> {
    to_wire_chunks(header, data, chunk_bytes)
}

/// One part of a parameter being pulled: its slice of the parameter's buffer,
/// written chunk by chunk as the chunks arrive, in order, with no copy between.
pub(crate) struct PartSink<'a> {
    cursor: ChunkCursor,
    values: &'a mut [f32],
    version: Option<Version>,
}

impl<'a> PartSink<'a> {
    /// A sink for the part `header` describes, writing into `values` (its length).
    pub(crate) fn new(header: TensorHeader, values: &'a mut [f32]) -> Self {
        Self {
            cursor: ChunkCursor::new(header),
            values,
            version: None,
        }
    }

    /// The part's key.
    pub(crate) fn key(&self) -> &ParamKey {
        &self.cursor.header().key
    }

    /// The part's size on the wire.
    pub(crate) fn byte_len(&self) -> usize {
        self.values.len() * self.cursor.header().dtype.size()
    }

    /// Writes the next chunk, `data` at byte `offset` of a tensor sent as
    /// `header`, at `version`; `data` may come as several pieces (the frames
    /// it arrived in).
    pub(crate) fn write(
        &mut self,
        header: &TensorHeader,
        offset: u64,
        data: Vec<Bytes>,
        version: Version,
    ) -> Result<(), MalformedReply> {
        let len = data.iter().map(Bytes::len).sum();
        self.cursor.advance(header, offset, len)?;
        let dtype = header.dtype;
        let first = offset as usize / dtype.size();
        let segments = whole_elements(data, dtype.size());
        let chunk = TensorData::from_segments(dtype, vec![len / dtype.size()], segments)?;
        let values = &mut self.values[first..first + chunk.len()];
        chunk.for_each_f32_run(|start, run| run.copy_to(&mut values[start..start + run.len()]));
        self.note_version(version);
        Ok(())
    }

    /// Reads the whole part, sent as `header` at `version`, from the next of
    /// `lent`'s payloads: straight from the ring into the part's values when
    /// they travel as they are kept (`f32`, little-endian), otherwise into a
    /// buffer first and decoded from there.
    pub(crate) async fn read_lent(
        &mut self,
        header: &TensorHeader,
        version: Version,
        lent: &mut LentPayloads,
    ) -> Result<(), PulledError> {
        let len = lent.next_len().ok_or(MalformedReply::Missing(
            "a pulled tensor without its payload",
        ))?;
        if !self.kept_as(header.dtype, len) {
            let data = lent.read_next_whole().await.map_err(PulledError::Ring)?;
            return Ok(self.write(header, 0, vec![data], version)?);
        }
        let advanced = self.cursor.advance(header, 0, len as usize);
        advanced.map_err(MalformedReply::from)?;
        let into = bytemuck::cast_slice_mut::<f32, u8>(self.values);
        lent.read_next(into).await.map_err(PulledError::Ring)?;
        self.note_version(version);
        Ok(())
    }

    /// Reads the whole part straight from the server's values `arena`, with
    /// no request, when an earlier pull's answer said where it lies and that block still
    /// holds the key's current values, at `min_version` or later, unchanged
    /// while they were copied, with the server serving by shard map
    /// `routed_by`, or routed by none ([`ArenaView::read_current`]). False
    /// when not (the part's buffer may then hold anything, and is pulled as
    /// usual).
    pub(crate) fn read_direct(
        &mut self,
        arena: &ArenaView,
        (min_version, routed_by): (Version, MapVersion),
    ) -> bool {
        let header = self.cursor.header();
        let Some(spot) = arena.spot_of(&header.key) else {
            return false;
        };
        if !self.kept_as(header.dtype, spot.len) {
            return false;
        }
        let header = header.clone();
        let into = bytemuck::cast_slice_mut::<f32, u8>(self.values);
        let wanted = (min_version.get(), routed_by.get());
        let Some(version) = arena.read_current(spot, wanted, into) else {
            return false;
        };
        if self.cursor.advance(&header, 0, into.len()).is_err() {
            return false;
        }
        self.note_version(Version(version));
        true
    }

    /// Whether `len` bytes of `dtype` are the part's values as this buffer
    /// keeps them (`f32`, little-endian, the whole part), to be copied
    /// straight into it.
    fn kept_as(&self, dtype: DType, len: u64) -> bool {
        dtype == DType::F32
            && cfg!(target_endian = "little")
            && len == std::mem::size_of_val(self.values) as u64
    }

    /// Keeps the oldest version any of the part's chunks came at.
    fn note_version(&mut self, version: Version) {
        self.version = Some(self.version.map_or(version, |v| v.min(version)));
    }

    /// The version of the values written, once every byte arrived.
    pub(crate) fn finish(&self) -> Result<Version, MalformedReply> {
        self.cursor.finish()?;
        Ok(self.version.unwrap_or(Version(0)))
    }
}

/// Why a pull's tensors could not be written into their sinks.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PulledError {
    /// The answer does not fit what was asked.
    #[error(transparent)]
    Malformed(#[from] MalformedReply),
    /// The shared-memory ring its payloads were lent on failed (`UNAVAILABLE`).
    #[error("{}", .0.message())]
    Ring(tonic::Status),
}

/// Writes a unary pull's tensors into `sinks` (found by key), their bytes in
/// the tensors or, when `lent`, still on a shared-memory ring, in order.
pub(crate) async fn write_pulled(
    sinks: &mut [PartSink<'_>],
    tensors: Vec<v1::PulledTensor>,
    mut lent: Option<LentPayloads>,
) -> Result<(), PulledError> {
    for pulled in tensors {
        let tensor = pulled
            .tensor
            .ok_or(MalformedReply::Missing("a PulledTensor without a tensor"))?;
        let header =
            TensorHeader::from_wire(&tensor.name, tensor.part, tensor.dtype, &tensor.shape)
                .map_err(MalformedReply::from)?;
        let sink = sink_for(sinks, &header.key)?;
        let version = Version(pulled.version);
        match lent.as_mut() {
            Some(lent) => sink.read_lent(&header, version, lent).await?,
            None => sink.write(&header, 0, vec![tensor.data], version)?,
        }
    }
    Ok(())
}

/// Writes one streamed pull chunk into `sinks` (found by key): `message`, its
/// chunk's data given apart as `data`, the pieces it arrived in.
pub(crate) fn write_pull_chunk(
    sinks: &mut [PartSink<'_>],
    message: v1::PullChunk,
    data: Vec<Bytes>,
) -> Result<(), MalformedReply> {
    let chunk = message
        .chunk
        .ok_or(MalformedReply::Missing("a PullChunk without a chunk"))?;
    let header = TensorHeader::from_wire(&chunk.name, chunk.part, chunk.dtype, &chunk.shape)?;
    let version = Version(message.version);
    sink_for(sinks, &header.key)?.write(&header, chunk.offset, data, version)
}

fn sink_for<'s, 'a>(
    sinks: &'s mut [PartSink<'a>],
    key: &ParamKey,
) -> Result<&'s mut PartSink<'a>, MalformedReply> {
    sinks
        .iter_mut()
        .find(|sink| sink.key() == key)
        .ok_or_else(|| MalformedReply::Unasked(key.clone()))
}

/// Each placed parameter's buffer in `into` cut into its parts' slices, as
/// `(server, sink)` per part. Afterwards `into` holds exactly the placed
/// parameters, each buffer resized to its parameter's length (kept as it is
/// when it fits, so a caller's buffers are reused from one pull to the next).
pub(crate) fn cut_into_parts<'a>(
    placement: &'a Placement,
    into: &'a mut BTreeMap<String, PulledParam>,
) -> Vec<(usize, PartSink<'a>)> {
    into.retain(|name, _| placement.get(name).is_some());
    for placed in placement.params() {
        if !into.contains_key(&placed.info.name) {
            into.insert(placed.info.name.clone(), PulledParam::default());
        }
    }
    let mut sinks = Vec::new();
    for (name, param) in into.iter_mut() {
        let placed = placement.get(name).expect("`into` holds only placed names");
        param.values.resize(placed.info.len(), 0.0);
        // A placement's parts are in element order and cover the parameter
        // exactly (`Placement::from_map` checks), so they cut the buffer in turn.
        let mut rest: &mut [f32] = &mut param.values;
        for part in &placed.parts {
            let (slice, tail) = std::mem::take(&mut rest).split_at_mut(part.len);
            rest = tail;
            sinks.push((part.server, PartSink::new(placed.header(part), slice)));
        }
    }
    sinks
}

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::codec::{DType, encode_f32};

    /// `w`: 6 elements in two parts, the second (elements 3..6) listed first and
    /// on server 1; `b`: 2 elements whole on server 0.
    fn placement() -> Placement {
        let info = |name: &str, shape: Vec<usize>| ParamInfo {
            name: name.into(),
            shape,
            dtype: DType::F32,
        };
        let part = |name: &str, part, server, start, len| {
            let part = Part {
                part,
                server,
                start,
                len,
            };
            (name.to_string(), part)
        };
        let params = [info("w", vec![2, 3]), info("b", vec![2])];
        let parts = [
            part("w", 1, 1, 3, 3),
            part("w", 0, 0, 0, 3),
            part("b", 0, 0, 0, 2),
        ];
        Placement::from_map(&params, &parts, 2).unwrap()
    }

    fn chunk(name: &str, part: u32, shape: u64, offset: u64, values: &[f32]) -> v1::PullChunk {
        v1::PullChunk {
            version: 4 + u64::from(part),
            chunk: Some(v1::TensorChunk {
                name: name.into(),
                part,
                dtype: DType::F32.to_proto(),
                shape: vec![shape],
                offset,
                data: encode_f32(DType::F32, values),
            }),
        }
    }

    #[test]
    fn chunks_are_written_into_each_parts_slice_of_a_reused_buffer() {
        let placement = placement();
        let mut into = BTreeMap::new();
        into.insert("gone".to_string(), PulledParam::default());
        for round in 0..2 {
            let before = into.get("w").map(|p: &PulledParam| p.values.as_ptr());
            let sinks = cut_into_parts(&placement, &mut into);
            assert_eq!(sinks.len(), 3);
            let servers: Vec<usize> = sinks.iter().map(|(server, _)| *server).collect();
            let mut sinks: Vec<PartSink<'_>> = sinks.into_iter().map(|(_, sink)| sink).collect();
            let w1 = sinks.iter().position(|s| s.key().part == 1).unwrap();
            assert_eq!(servers[w1], 1, "part 1 of w lives on server 1");
            let r = round as f32;
            // Part 1 of `w` arrives in two chunks, at byte offsets 0 and 8.
            let parts = [
                chunk("w", 1, 3, 0, &[r + 4.0, r + 5.0]),
                chunk("w", 1, 3, 8, &[r + 6.0]),
                chunk("w", 0, 3, 0, &[r + 1.0, r + 2.0, r + 3.0]),
                chunk("b", 0, 2, 0, &[r, -r]),
            ];
            for message in parts {
                write_cut(&mut sinks, message).unwrap();
            }
            let versions: Vec<Version> = sinks.iter().map(|s| s.finish().unwrap()).collect();
            assert!(versions.contains(&Version(4)) && versions.contains(&Version(5)));
            drop(sinks);
            assert_eq!(
                into.keys().collect::<Vec<_>>(),
                ["b", "w"],
                "only placed names stay"
            );
            assert_eq!(
                into["w"].values,
                [1.0, 2.0, 3.0, 4.0, 5.0, 6.0].map(|v| v + r)
            );
            assert_eq!(into["b"].values, [r, -r]);
            if let Some(before) = before {
                assert_eq!(into["w"].values.as_ptr(), before, "the buffer is reused");
            }
        }
    }

    /// Writes `message` as a framed pull hands it on: its data apart, cut at
    /// byte 3 (inside the first element) into two pieces.
    fn write_cut(
        sinks: &mut [PartSink<'_>],
        mut message: v1::PullChunk,
    ) -> Result<(), MalformedReply> {
        let data = message
            .chunk
            .as_mut()
            .map(|chunk| std::mem::take(&mut chunk.data))
            .unwrap_or_default();
        let cut = data.len().min(3);
        write_pull_chunk(sinks, message, vec![data.slice(..cut), data.slice(cut..)])
    }

    #[test]
    fn a_malformed_reply_is_refused_by_name() {
        let placement = placement();
        let mut into = BTreeMap::new();
        let mut sinks: Vec<PartSink<'_>> = cut_into_parts(&placement, &mut into)
            .into_iter()
            .map(|(_, sink)| sink)
            .collect();
        let refusal = |sinks: &mut [PartSink<'_>], message| {
            write_cut(sinks, message).unwrap_err().to_string()
        };
        let unasked = refusal(&mut sinks, chunk("v", 0, 3, 0, &[1.0]));
        assert!(unasked.contains("not asked for"), "{unasked}");
        let gap = refusal(&mut sinks, chunk("w", 1, 3, 4, &[1.0]));
        assert!(gap.contains("`w`#1 at byte 4 leaves a gap"), "{gap}");
        let reshaped = refusal(&mut sinks, chunk("w", 1, 4, 0, &[1.0]));
        assert!(reshaped.contains("f32 [4]"), "{reshaped}");
        let overrun = refusal(&mut sinks, chunk("w", 1, 3, 0, &[1.0, 2.0, 3.0, 4.0]));
        assert!(overrun.contains("`w`#1"), "{overrun}");
        let missing = v1::PullChunk {
            version: 1,
            chunk: None,
        };
        assert!(refusal(&mut sinks, missing).contains("without a chunk"));

        write_cut(&mut sinks, chunk("w", 1, 3, 0, &[1.0])).unwrap();
        let short = sinks
            .iter()
            .find(|s| s.key().part == 1 && s.key().name == "w")
            .unwrap();
        let incomplete = short.finish().unwrap_err().to_string();
        assert!(incomplete.contains("`w`#1"), "{incomplete}");
    }
}
