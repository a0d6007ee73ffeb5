//! Byte sizes as people write them: `64B`, `4KiB`, `1MiB`, `10KB` (decimal), `16MiB`.

/// Parses one size.
///
/// # Errors
/// A message naming the text and the units understood.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size like 64B, 4KiB or 16MiB"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`; use B, KiB, MiB, GiB, KB, MB or GB"
            ));
        }
    };
    let bytes = (number * scale).round();
    if bytes > usize::MAX as f64 {
        return Err(format!("`{text}` is larger than this machine can address"));
    }
    Ok(bytes as usize)
}

/// Parses one size that must fit 32 bits (HTTP/2 windows and frames).
///
/// # Errors
/// As [`parse_size`], or a message when the size is 4GiB or more.
pub fn parse_size_u32(text: &str) -> Result<u32, String> {
    let bytes = parse_size(text)?;
    u32::try_from(bytes).map_err(|_| format!("`{text}` is {bytes} bytes; at most 4GiB-1 fits here"))
}

/// Parses a comma-separated list of sizes.
///
/// # Errors
/// As [`parse_size`].
pub fn parse_sizes(text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(parse_size)
        .collect()
}

/// A size in the largest binary unit that keeps it whole-ish: `64B`, `4KiB`, `1.5MiB`.
pub fn format_size(bytes: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value}{}", UNITS[unit])
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

/// A rate in bytes per second as `1.23 GB/s` (decimal, as network rates are given).
pub fn format_rate(bytes_per_sec: f64) -> String {
    if bytes_per_sec >= 1e9 {
        format!("{:.2} GB/s", bytes_per_sec / 1e9)
    } else if bytes_per_sec >= 1e6 {
        format!("{:.1} MB/s", bytes_per_sec / 1e6)
    } else {
        format!("{:.1} KB/s", bytes_per_sec / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(
            parse_sizes("64B,4KiB,1MiB,16MiB,64MiB").unwrap(),
            vec![64, 4096, 1 << 20, 16 << 20, 64 << 20]
        );
        assert_eq!(parse_size("10KB").unwrap(), 10_000);
        assert_eq!(parse_size("1.5MiB").unwrap(), 3 << 19);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("-1MiB").is_err());
        assert!(parse_size("1e300GiB").is_err());
        assert_eq!(parse_size_u32("64MiB").unwrap(), 64 << 20);
        assert!(
            parse_size_u32("4GiB")
                .unwrap_err()
                .contains("at most 4GiB-1")
        );
    }

    #[test]
    fn formats_round_trip() {
        for size in ["64B", "4KiB", "16MiB", "1.5MiB"] {
            assert_eq!(format_size(parse_size(size).unwrap()), size);
        }
        assert_eq!(format_rate(3.2e9), "3.20 GB/s");
    }
}
