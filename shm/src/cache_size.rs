//! [`last_level_cache_bytes`] and [`level_two_cache_bytes`]: the sizes of
//! the largest cache this process's first core reports and of its own
//! second-level cache, read once from Linux's sysfs, for copies that choose
//! between ordinary stores and stores that bypass the cache.

use std::path::Path;
use std::sync::OnceLock;

/// Where Linux lists the caches of the first core, one `indexN` folder each.
const CACHES: &str = "/sys/devices/system/cpu/cpu0/cache";

/// The bytes of the highest-level cache of the first core (an L3 shared by
/// several cores, on the machines this project is measured on), or `None`
/// where sysfs does not say. Read once per process.
pub fn last_level_cache_bytes() -> Option<u64> {
    static BYTES: OnceLock<Option<u64>> = OnceLock::new();
    *BYTES.get_or_init(|| read_last_level(Path::new(CACHES)))
}

/// The bytes of the first core's second-level cache (its own on the
/// machines this project is measured on), or `None` where sysfs does not
/// say. Read once per process.
pub fn level_two_cache_bytes() -> Option<u64> {
    static BYTES: OnceLock<Option<u64>> = OnceLock::new();
    *BYTES.get_or_init(|| read_level(Path::new(CACHES), 2))
}

/// The size of the cache with the highest level under `caches`.
fn read_last_level(caches: &Path) -> Option<u64> {
    read_caches(caches)
        .into_iter()
        .max_by_key(|&(level, bytes)| (level, bytes))
        .map(|(_, bytes)| bytes)
}

/// The size of the largest cache of `level` under `caches`.
fn read_level(caches: &Path, level: u32) -> Option<u64> {
    read_caches(caches)
        .into_iter()
        .filter(|&(at, _)| at == level)
        .map(|(_, bytes)| bytes)
        .max()
}

/// Each cache under `caches` that says its level and size: `(level, bytes)`.
fn read_caches(caches: &Path) -> Vec<(u32, u64)> {
    let Ok(entries) = std::fs::read_dir(caches) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|entry| {
            let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
            let level = read("level")?.trim().parse::<u32>().ok()?;
            let bytes = parse_size(&read("size")?)?;
            Some((level, bytes))
        })
        .collect()
}

/// A sysfs cache size: a count of bytes with an optional `K`, `M` or `G`
/// (binary units), as in `32768K`.
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let count = digits.parse::<u64>().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    count.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(parse_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn the_highest_level_is_the_last_level_and_level_two_is_found_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for (index, level, size) in [(0, "1", "48K"), (2, "2", "1024K"), (3, "3", "32768K")] {
            let folder = dir.path().join(format!("index{index}"));
            std::fs::create_dir(&folder).unwrap();
            std::fs::write(folder.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(folder.join("size"), format!("{size}\n")).unwrap();
        }
        std::fs::create_dir(dir.path().join("uevent")).unwrap();
        assert_eq!(read_last_level(dir.path()), Some(32 << 20));
        assert_eq!(read_level(dir.path(), 2), Some(1 << 20));
        assert_eq!(read_level(dir.path(), 4), None);
        assert_eq!(read_last_level(&dir.path().join("absent")), None);
        assert_eq!(read_level(&dir.path().join("absent"), 2), None);
    }
}
