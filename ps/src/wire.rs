//! Conversions between `ps.v1` messages and the store's domain types, with every
//! field validated (a bad field becomes an [`Error`], never a panic).

use ps_proto::codec::{DType, TensorData, checked_shape, element_count, wire_shape};
use ps_proto::header::TensorHeader;
use ps_proto::key::ParamKey;
use ps_proto::v1;

use crate::error::{Error, Result};
use crate::group::JoinRequest;
use crate::optimizer::OptimizerSpec;
use crate::param::ParamSpec;
use crate::store::{KeySummary, Pulled, Pushed, Registered, Stats};

/// Validates a `JoinGroup` request: an empty expectation means "whatever the
/// server has".
///
/// # Errors
/// `InvalidField` for a consistency model that does not parse.
pub fn join_request(request: v1::JoinGroupRequest) -> Result<JoinRequest> {
    let consistency = match request.expected_consistency.as_str() {
        "" => None,
        text => Some(text.parse().map_err(|reason| Error::InvalidField {
            field: "expected_consistency",
            reason,
        })?),
    };
    Ok(JoinRequest {
        client_id: request.client_id,
        workers: (request.expected_workers != 0).then_some(request.expected_workers),
        consistency,
        rank: request.rank,
    })
}

/// Validates a parameter spec from the wire.
///
/// # Errors
/// `Codec` for a bad dtype or shape, `InvalidOptimizer` for a bad optimizer.
pub fn param_spec(spec: &v1::ParameterSpec) -> Result<ParamSpec> {
    let key = ParamKey::new(&spec.name, spec.part);
    let codec = |source| Error::Codec {
        key: key.clone(),
        source,
    };
    let dtype = DType::from_proto(spec.dtype).map_err(codec)?;
    let shape = checked_shape(&spec.shape, dtype).map_err(codec)?;
    let whole_shape = whole_shape(spec, dtype, &shape).map_err(|reason| Error::InvalidField {
        field: "whole_shape",
        reason: format!("{key}: {reason}"),
    })?;
    let optimizer = OptimizerSpec::from_proto(spec.optimizer.as_ref()).map_err(|reason| {
        Error::InvalidOptimizer {
            key: key.clone(),
            reason,
        }
    })?;
    Ok(ParamSpec {
        header: TensorHeader::new(key, dtype, shape),
        whole_shape,
        optimizer,
    })
}

/// The whole parameter's shape of a partition: empty, or one that can hold it.
fn whole_shape(
    spec: &v1::ParameterSpec,
    dtype: DType,
    shape: &[usize],
) -> std::result::Result<Vec<usize>, String> {
    if spec.whole_shape.is_empty() {
        return Ok(Vec::new());
    }
    let whole = checked_shape(&spec.whole_shape, dtype).map_err(|e| e.to_string())?;
    if element_count(&whole) < element_count(shape) {
        return Err(format!(
            "the whole parameter {whole:?} is smaller than this partition {shape:?}"
        ));
    }
    Ok(whole)
}

/// Validates one parameter of a `Register` request; empty initial data means zeros.
///
/// # Errors
/// As [`param_spec`], and `Codec` when the initial data does not fit the shape.
pub fn param_init(init: &v1::ParameterInit) -> Result<(ParamSpec, Option<TensorData>)> {
    let spec = init.spec.as_ref().ok_or(Error::EmptyRequest {
        what: "a ParameterInit without a spec",
    })?;
    let spec = param_spec(spec)?;
    if init.initial.is_empty() {
        return Ok((spec, None));
    }
    let initial = TensorData::new(
        spec.header.dtype,
        spec.header.shape.clone(),
        init.initial.clone(),
    )
    .map_err(|source| Error::Codec {
        key: spec.header.key.clone(),
        source,
    })?;
    Ok((spec, Some(initial)))
}

/// Validates a tensor from the wire.
///
/// # Errors
/// `Codec` naming the tensor.
pub fn tensor(tensor: &v1::Tensor) -> Result<(ParamKey, TensorData)> {
    let key = ParamKey::new(&tensor.name, tensor.part);
    match TensorData::from_proto(tensor) {
        Ok(data) => Ok((key, data)),
        Err(source) => Err(Error::Codec { key, source }),
    }
}

/// A key reference from the wire.
pub fn key(key: &v1::KeyRef) -> ParamKey {
    ParamKey::new(&key.name, key.part)
}

/// The wire form of a `Register` outcome.
pub fn register_response(registered: Vec<Registered>) -> v1::RegisterResponse {
    let keys = registered
        .into_iter()
        .map(|r| v1::RegisteredKey {
            name: r.key.name,
            part: r.key.part,
            created: r.created,
            version: r.version.get(),
        })
        .collect();
    v1::RegisterResponse { keys }
}

/// The wire form of a `Push` outcome.
pub fn push_response(pushed: Vec<Pushed>) -> v1::PushResponse {
    let keys = pushed
        .into_iter()
        .map(|p| v1::PushedKey {
            name: p.key.name,
            part: p.key.part,
            accepted: p.accepted,
            version: p.version.get(),
        })
        .collect();
    v1::PushResponse { keys }
}

/// The wire form of pulled values.
pub fn pulled_tensor(pulled: Pulled) -> v1::PulledTensor {
    v1::PulledTensor {
        tensor: Some(pulled.header.into_tensor(pulled.data)),
        version: pulled.version.get(),
        arena: None,
    }
}

/// The chunks of pulled values for `PullStream`.
pub fn pull_chunks(
    pulled: &Pulled,
    chunk_bytes: usize,
) -> impl Iterator<Item = v1::PullChunk> + use<> {
    let version = pulled.version.get();
    ps_proto::chunk::to_wire_chunks(&pulled.header, &pulled.data, chunk_bytes)
        .into_iter()
        .map(move |chunk| v1::PullChunk {
            chunk: Some(chunk),
            version,
        })
}

fn key_stats(summary: &KeySummary) -> v1::KeyStats {
    v1::KeyStats {
        name: summary.spec.header.key.name.clone(),
        part: summary.spec.header.key.part,
        dtype: summary.spec.header.dtype.to_proto(),
        shape: wire_shape(&summary.spec.header.shape),
        version: summary.version.get(),
        bytes: summary.bytes as u64,
    }
}

/// The wire form of the store's statistics.
pub fn stats_response(stats: &Stats, consistency: String, workers: u32) -> v1::StatsResponse {
    v1::StatsResponse {
        keys: stats.keys.len() as u64,
        bytes: stats.keys.iter().map(|k| k.bytes as u64).sum(),
        pushes: stats.pushes,
        pulls: stats.pulls,
        duplicate_pushes: stats.duplicate_pushes,
        rejected: stats.rejected,
        consistency,
        workers,
        key_stats: stats.keys.iter().map(key_stats).collect(),
        memory_held_bytes: stats.memory_held as u64,
        memory_budget_bytes: stats.memory_budget as u64,
    }
}
