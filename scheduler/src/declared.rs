//! Validation of a `DeclareParams` request: every parameter's name, dtype and
//! size, the model's total bytes, and the size of the shard map it would make,
//! so that no declaration makes the scheduler build or send an answer without
//! bound.

use ps_proto::codec::DType;
use ps_proto::placement::{DEFAULT_PART_BYTES, MAX_PART_BYTES, Param, part_counts};
use ps_proto::transport::DEFAULT_MAX_MESSAGE_BYTES;
use ps_proto::v1;
use tonic::Status;

/// The most parameter bytes one `DeclareParams` may declare (1 TiB): far past
/// any model a cluster of parameter servers holds, and small enough that the
/// byte counts stay bounded.
pub const MAX_DECLARED_BYTES: u64 = 1 << 40;

/// The longest parameter name: each part of the shard map repeats it.
pub const MAX_NAME_BYTES: usize = 256;

/// The most bytes the parts of a shard map may take: a map is one message, and
/// every client reads messages of up to 4 MiB by default. The rest of that
/// leaves room for the server list (up to 1024 addresses) and the workers.
pub const MAX_MAP_PARTS_BYTES: usize = DEFAULT_MAX_MESSAGE_BYTES - (1 << 20);

/// Bytes a map part takes besides its name, at most: five protobuf fields.
const PART_OVERHEAD_BYTES: usize = 32;

/// The declared parameters, each checked, and the map they make over `servers`
/// servers checked against [`MAX_MAP_PARTS_BYTES`].
///
/// # Errors
/// `INVALID_ARGUMENT` naming the parameter (or the map) that is out of bounds.
pub fn declared_params(
    declared: Vec<v1::DeclaredParam>,
    servers: usize,
) -> Result<Vec<Param>, Status> {
    if declared.is_empty() {
        return Err(Status::invalid_argument(
            "DeclareParams needs at least one parameter",
        ));
    }
    let mut params = Vec::with_capacity(declared.len());
    let mut total: u64 = 0;
    for p in declared {
        if p.name.is_empty() || p.name.len() > MAX_NAME_BYTES {
            return Err(Status::invalid_argument(format!(
                "a parameter name must have 1 to {MAX_NAME_BYTES} bytes; got {} bytes starting {:?}",
                p.name.len(),
                p.name.chars().take(32).collect::<String>()
            )));
        }
        let dtype = DType::from_proto(p.dtype)
            .map_err(|e| Status::invalid_argument(format!("parameter {}: {e}", p.name)))?;
        let bytes = p.elements.checked_mul(dtype.size() as u64);
        total = bytes.and_then(|b| total.checked_add(b)).unwrap_or(u64::MAX);
        if total > MAX_DECLARED_BYTES {
            return Err(Status::invalid_argument(format!(
                "parameter {} declares {} elements of {dtype}, which brings the model past \
                 the 1 TiB a scheduler places; check the declared shapes",
                p.name, p.elements,
            )));
        }
        let elements = usize::try_from(p.elements)
            .map_err(|_| Status::invalid_argument(format!("parameter {} is too large", p.name)))?;
        params.push(Param {
            name: p.name,
            elements,
            elem_size: dtype.size(),
        });
    }
    check_map_size(&params, servers)?;
    Ok(params)
}

/// Bytes the parts of a map of `params` over `servers` servers take with the
/// coarsest parts the planner makes ([`MAX_PART_BYTES`]), counted without
/// planning it.
pub fn map_parts_bytes(params: &[Param], servers: usize) -> usize {
    parts_bytes_with_cap(params, servers, MAX_PART_BYTES)
}

/// The largest part of a map of `params` cut for `cut_for` servers: the
/// `wanted` size (`--partition-bytes`, [`DEFAULT_PART_BYTES`] by default)
/// when its map fits in [`MAX_MAP_PARTS_BYTES`]; otherwise the default size,
/// if larger than `wanted` and fitting; otherwise [`MAX_PART_BYTES`], the
/// coarsest cut (which [`declared_params`] made sure fits).
pub fn part_cap(params: &[Param], cut_for: usize, wanted: usize) -> usize {
    let fits = |cap: usize| parts_bytes_with_cap(params, cut_for, cap) <= MAX_MAP_PARTS_BYTES;
    [wanted, wanted.max(DEFAULT_PART_BYTES)]
        .into_iter()
        .find(|&cap| fits(cap))
        .unwrap_or(MAX_PART_BYTES)
}

fn parts_bytes_with_cap(params: &[Param], servers: usize, cap: usize) -> usize {
    part_counts(params, servers, cap)
        .iter()
        .zip(params)
        .map(|(parts, param)| parts.saturating_mul(param.name.len() + PART_OVERHEAD_BYTES))
        .fold(0, usize::saturating_add)
}

/// The most servers, up to `servers`, for which a map of `params` cut as
/// finely as that many servers call for fits in [`MAX_MAP_PARTS_BYTES`]; at
/// least 1. More servers cut parameters finer, so a map over servers that
/// joined after the model was declared could outgrow one message: its parts
/// are cut for this many instead (coarser, and still spread over every server).
pub fn finest_fitting_cut(params: &[Param], servers: usize) -> usize {
    let fits = |n: usize| map_parts_bytes(params, n) <= MAX_MAP_PARTS_BYTES;
    if fits(servers) {
        return servers.max(1);
    }
    // More servers never make fewer parts: the largest count that fits, by halves.
    let (mut fitting, mut too_many) = (1, servers);
    while too_many - fitting > 1 {
        let middle = fitting + (too_many - fitting) / 2;
        match fits(middle) {
            true => fitting = middle,
            false => too_many = middle,
        }
    }
    fitting
}

/// Refuses a model whose shard map over `servers` would not fit in one message.
fn check_map_size(params: &[Param], servers: usize) -> Result<(), Status> {
    let bytes = map_parts_bytes(params, servers);
    if bytes > MAX_MAP_PARTS_BYTES {
        let parts: usize = part_counts(params, servers, MAX_PART_BYTES).iter().sum();
        return Err(Status::invalid_argument(format!(
            "the model's {} parameters make a shard map of {parts} parts ({bytes} bytes) over {servers} \
             servers, past the {MAX_MAP_PARTS_BYTES} bytes one map may take; declare fewer \
             parameters, shorter names or a smaller model",
            params.len(),
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, elements: u64) -> v1::DeclaredParam {
        v1::DeclaredParam {
            name: name.into(),
            elements,
            dtype: v1::DType::DtypeF32 as i32,
        }
    }

    fn refused(declared: Vec<v1::DeclaredParam>, needle: &str) {
        let status = declared_params(declared, 2).expect_err(needle);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(needle), "{}", status.message());
    }

    #[test]
    fn a_real_model_is_taken() {
        let params = declared_params(vec![param("w", 1 << 20), param("b", 10)], 2).unwrap();
        assert_eq!(params.len(), 2);
    }

    #[test]
    fn names_must_be_short_and_present() {
        refused(vec![param("", 1)], "1 to 256 bytes");
        refused(vec![param(&"x".repeat(257), 1)], "got 257 bytes");
    }

    #[test]
    fn parts_are_small_unless_that_makes_the_map_too_large() {
        let small = declared_params(vec![param("w", 1 << 22)], 2).unwrap();
        assert_eq!(part_cap(&small, 2, DEFAULT_PART_BYTES), DEFAULT_PART_BYTES);
        assert_eq!(part_cap(&small, 2, 256 << 10), 256 << 10);
        // 64 GiB under a 100-byte name: 65,536 parts of 1 MiB would make an
        // 8.7 MB map; 16,384 parts of 4 MiB (2.2 MB) fit.
        let large = declared_params(vec![param(&"n".repeat(100), 1 << 34)], 2).unwrap();
        assert_eq!(part_cap(&large, 2, DEFAULT_PART_BYTES), MAX_PART_BYTES);
        // 4 GiB: 65,536 parts of 64 KiB would make an 8.7 MB map, 4,096
        // parts of the default 1 MiB fit; asking for small parts never
        // gives larger ones than the default when the default fits.
        let middle = declared_params(vec![param(&"n".repeat(100), 1 << 30)], 2).unwrap();
        assert_eq!(part_cap(&middle, 2, 64 << 10), DEFAULT_PART_BYTES);
    }

    #[test]
    fn a_map_too_large_for_one_message_is_refused() {
        // 1 TiB of floats in one parameter with a 256-byte name: 262,144 parts of
        // 4 MiB, each repeating the name, would make a 70 MB map.
        refused(
            vec![param(&"n".repeat(256), 1 << 38)],
            "shard map of 262144 parts",
        );
        // Many small parameters: one part each.
        let many = (0..20_000)
            .map(|i| param(&format!("{i:0>200}"), 1))
            .collect();
        refused(many, "20000 parameters");
    }
}
