//! Reading a whole client stream before it is applied: `RegisterStream`'s
//! chunks ([`read_register_stream`]) and `PushStream`'s ([`read_push_stream`]).
//! Each message is admitted and charged as it arrives ([`Admitted`]), checked
//! against the store, and handed to an [`Assembler`] that puts each tensor back
//! together.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use ps_proto::chunk::{Assembler, ChunkError};
use ps_proto::codec::TensorData;
use ps_proto::header::TensorHeader;
use ps_proto::ids::{Rank, Step, Version};
use ps_proto::key::ParamKey;
use ps_proto::metadata;
use ps_proto::v1;
use tonic::{Request, Streaming};

use crate::admission::Admitted;
use crate::budget::Charge;
use crate::error::{Error, Result};
use crate::param::ParamSpec;
use crate::push_buffer::Reservation;
use crate::push_source::{FramedPushChunks, next_message};
use crate::store::Store;
use crate::wire;

/// The bytes a push stream declares in its `ps-push-bytes` header, if it has one.
pub(crate) fn declared_push_bytes<T>(request: &Request<T>) -> Result<Option<usize>> {
    let Some(value) = request.metadata().get(metadata::PUSH_BYTES) else {
        return Ok(None);
    };
    let bad = || Error::BadPushBytes {
        value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
    };
    let text = value.to_str().map_err(|_| bad())?;
    text.parse().map(Some).map_err(|_| bad())
}

/// Reads a whole `RegisterStream`, checking that every chunk of a key repeats its spec
/// and that the spec is within the server's size limit. Returns the parameters and
/// the stream's restore version.
pub(crate) async fn read_register_stream(
    store: &Store,
    stream: &mut Streaming<v1::RegisterChunk>,
    idle: Duration,
    buffered: &mut Charge,
) -> Result<(Vec<(ParamSpec, Option<TensorData>)>, Version)> {
    let mut assembler = Assembler::new();
    let mut specs: Vec<ParamSpec> = Vec::new();
    let mut restore_version = 0;
    while let Some(message) = next_message(stream, idle).await? {
        restore_version = restore_version.max(message.restore_version);
        let spec = message.spec.as_ref().ok_or(Error::EmptyRequest {
            what: "a RegisterChunk without a spec",
        })?;
        let admitted = Admitted::map(store, message.map_version).await?;
        let spec = wire::param_spec(spec)?;
        store.check_size(&spec)?;
        match specs.iter().find(|s| s.header.key == spec.header.key) {
            Some(first) if *first != spec => {
                let (first, now) = (first.describe(), spec.describe());
                return Err(ChunkError::HeaderChanged {
                    key: spec.header.key,
                    first,
                    now,
                }
                .into());
            }
            Some(_) => {}
            None => specs.push(spec.clone()),
        }
        admitted.add_to(buffered, message.data.len(), || {
            format!("buffering a register stream of {}", spec.header.key)
        })?;
        // A chunk's bytes as decoded share an allocation of the stream's decode
        // buffer that is larger than the chunk: kept as they are, the buffered
        // bytes held more memory than the budget charged (six 1 GiB
        // registrations on a 256 MiB budget peaked at 376-456 MiB, and at
        // 334-355 MiB with this copy). A copy of exactly the charged length
        // bounds it; registration is once per key, so the copy is cheap.
        let data = Bytes::copy_from_slice(&message.data);
        assembler.add(spec.header.clone(), message.offset, data)?;
    }
    let tensors = assembler.finish()?;
    let params = specs
        .into_iter()
        .zip(tensors)
        .map(|(spec, (_, data))| (spec, Some(data)))
        .collect();
    Ok((params, Version(restore_version)))
}

/// Reads a whole `PushStream`: `(worker, step, gradients)`. The first chunk of each
/// key is checked against the store, so a bad stream is refused before it is read,
/// and each chunk is scanned for NaN and infinity as it arrives.
pub(crate) async fn read_push_stream(
    store: &Store,
    stream: &mut FramedPushChunks,
    idle: Duration,
    buffered: &mut Charge,
    room: Option<&Reservation>,
) -> Result<(Rank, Step, Vec<(ParamKey, TensorData)>)> {
    let mut assembler = Assembler::new();
    let mut carried = 0usize;
    let mut checked = HashSet::new();
    let mut origin = None;
    let mut index = 0;
    while let Some((message, data)) = stream.next_chunk(idle).await? {
        let sender = (Rank(message.worker_id), Step(message.step));
        let (worker, step) = *origin.get_or_insert(sender);
        if sender != (worker, step) {
            let (got_worker, got_step) = sender;
            return Err(Error::MixedStream {
                index,
                worker,
                step,
                got_worker,
                got_step,
            });
        }
        let chunk = message.chunk.as_ref().ok_or(Error::EmptyRequest {
            what: "a PushChunk without a chunk",
        })?;
        let admitted = Admitted::map(store, message.map_version).await?;
        let header = TensorHeader::from_wire(&chunk.name, chunk.part, chunk.dtype, &chunk.shape)?;
        if checked.insert(header.key.clone()) {
            store.check_gradient_header(&header)?;
        }
        let len: usize = data.iter().map(Bytes::len).sum();
        carried = carried.saturating_add(len);
        if let Some(room) = room.filter(|room| carried > room.declared) {
            return Err(Error::PushOverDeclared {
                declared: room.declared,
            });
        }
        admitted.add_to(buffered, len, || {
            format!("buffering a push stream from worker {worker} for step {step}")
        })?;
        // Scanned once the assembler has taken it, so that its offset is known to
        // be whole elements inside the gradient, and so is each piece it kept.
        let mut offset = chunk.offset;
        for piece in assembler.add_pieces(header.clone(), chunk.offset, data)? {
            store.check_gradient_chunk(&header, offset, piece)?;
            offset += piece.len() as u64;
        }
        index += 1;
    }
    let (worker, step) = origin.ok_or(Error::EmptyRequest {
        what: "the push stream carried no chunks",
    })?;
    Ok((worker, step, assembler.finish()?))
}
