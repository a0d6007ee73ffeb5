//! Embedding tables on the wire: which bucket a row id belongs to, which
//! server holds a bucket, and ids and rows as raw little-endian bytes.
//!
//! A table's rows are spread over a fixed number of buckets by a mix of the
//! id ([`bucket_of`]), so that neighbouring ids (the frequent ones of a Zipf
//! distribution are the small ones) land on different buckets. A bucket is the
//! unit a server holds, checkpoints and hands on: [`bucket_owner`] picks its
//! server by rendezvous hashing over the servers' addresses, so losing a server
//! moves only the buckets it held, and every worker and tool computes the same
//! owner from the same shard map.

use bytes::Bytes;

/// The most buckets a table may have.
pub const MAX_BUCKETS: u32 = 1 << 16;
/// The widest row.
pub const MAX_WIDTH: u32 = 1 << 16;
/// Buckets a client gives a table that does not say: enough to spread over
/// dozens of servers, few enough that an empty block per bucket costs nothing.
pub const DEFAULT_BUCKETS: u32 = 64;
/// The most ids one `PullRows` or `PushRows` may carry.
pub const MAX_IDS_PER_REQUEST: usize = 1 << 20;
/// Bytes of one id on the wire.
pub const ID_BYTES: usize = 8;

/// SplitMix64's finaliser: every input bit moves every output bit.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// FNV-1a of `bytes`: a stable 64-bit hash of a name.
pub fn name_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The bucket of row `id` in a table of `buckets` buckets (at least 1).
pub fn bucket_of(id: u64, buckets: u32) -> u32 {
    (mix(id) % u64::from(buckets.max(1))) as u32
}

/// The index into `servers` (addresses as the shard map names them) of the
/// server holding `bucket` of `table`: the one with the highest score of the
/// three together. `None` for no servers.
pub fn bucket_owner<S: AsRef<str>>(table: &str, bucket: u32, servers: &[S]) -> Option<usize> {
    let key = mix(name_hash(table.as_bytes()) ^ mix(u64::from(bucket)));
    servers
        .iter()
        .enumerate()
        .max_by_key(|(_, addr)| mix(key ^ name_hash(addr.as_ref().as_bytes())))
        .map(|(index, _)| index)
}

/// `ids` as the wire carries them.
pub fn encode_ids(ids: &[u64]) -> Bytes {
    if cfg!(target_endian = "little") {
        return Bytes::copy_from_slice(bytemuck::cast_slice(ids));
    }
    let mut out = Vec::with_capacity(ids.len() * ID_BYTES);
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    Bytes::from(out)
}

/// The ids of a `RowBlock`, or why they cannot be read.
///
/// # Errors
/// A message naming the length when it is not a multiple of 8 bytes.
pub fn decode_ids(bytes: &[u8]) -> Result<Vec<u64>, String> {
    if !bytes.len().is_multiple_of(ID_BYTES) {
        return Err(format!(
            "ids take {} bytes, which is not a whole number of 8-byte ids",
            bytes.len()
        ));
    }
    if cfg!(target_endian = "little") {
        let mut ids = vec![0u64; bytes.len() / ID_BYTES];
        bytemuck::cast_slice_mut::<u64, u8>(&mut ids).copy_from_slice(bytes);
        return Ok(ids);
    }
    Ok(bytes
        .chunks_exact(ID_BYTES)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
        .collect())
}

/// Appends `rows` (f32 elements) to `out` as the wire carries them.
pub fn extend_rows(out: &mut Vec<u8>, rows: &[f32]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(rows));
    } else {
        for value in rows {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
}

/// `rows` (f32 elements) as the wire carries them.
pub fn encode_rows(rows: &[f32]) -> Bytes {
    let mut out = Vec::with_capacity(rows.len() * 4);
    extend_rows(&mut out, rows);
    Bytes::from(out)
}

/// Writes the f32 elements of `bytes` into `out`, which holds exactly as many.
///
/// # Panics
/// When the lengths differ.
pub fn copy_rows(bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() * 4, "rows of another length");
    if cfg!(target_endian = "little") {
        bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(bytes);
    } else {
        for (value, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *value = f32::from_le_bytes(b.try_into().unwrap_or_default());
        }
    }
}

/// The f32 elements of `bytes`, which must be a whole number of elements.
///
/// # Errors
/// A message naming the length otherwise.
pub fn decode_rows(bytes: &[u8]) -> Result<Vec<f32>, String> {
    if !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "rows take {} bytes, which is not a whole number of 4-byte elements",
            bytes.len()
        ));
    }
    let mut out = vec![0.0; bytes.len() / 4];
    copy_rows(bytes, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_stable_and_spread_neighbouring_ids() {
        // Pinned: a change here moves every stored row. The first is the
        // published first output of SplitMix64 seeded with 0.
        assert_eq!(mix(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(1), 0x5692_161d_100b_05e5);
        let mut counts = [0usize; 8];
        for id in 0..8_000 {
            counts[bucket_of(id, 8) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (900..1100).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn losing_a_server_moves_only_its_buckets() {
        let three = ["a:1", "b:1", "c:1"];
        let two = ["a:1", "c:1"];
        let mut moved = 0;
        for bucket in 0..300 {
            let before = three[bucket_owner("emb", bucket, &three).unwrap()];
            let after = two[bucket_owner("emb", bucket, &two).unwrap()];
            if before != "b:1" {
                assert_eq!(before, after, "bucket {bucket} moved off a live server");
            } else {
                moved += 1;
            }
        }
        assert!(
            (70..130).contains(&moved),
            "{moved} of 300 buckets were on b"
        );
        assert_eq!(bucket_owner::<&str>("emb", 0, &[]), None);
    }

    #[test]
    fn ids_and_rows_round_trip_and_bad_lengths_are_named() {
        let ids = [0, 7, u64::MAX];
        assert_eq!(decode_ids(&encode_ids(&ids)).unwrap(), ids);
        let rows = [1.5f32, -0.25];
        assert_eq!(decode_rows(&encode_rows(&rows)).unwrap(), rows);
        assert!(decode_ids(&[0; 9]).unwrap_err().contains("9 bytes"));
        assert!(decode_rows(&[0; 3]).unwrap_err().contains("3 bytes"));
    }
}
