//! [`parse_device`]: the candle device from `cpu` or `cuda:N`. CUDA needs the
//! crate's opt-in `cuda` feature; without it, asking for CUDA is a clear error.

use candle_core::Device;

/// `cpu`, `cuda` (GPU 0) or `cuda:N`.
///
/// # Errors
/// A message naming the device and what to do.
pub fn parse_device(text: &str) -> Result<Device, String> {
    let ordinal = match text.to_ascii_lowercase().as_str() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| format!("unknown device `{text}`; use cpu or cuda:N"))?,
    };
    if !cfg!(feature = "cuda") {
        return Err(format!(
            "device `{text}` needs CUDA, but this binary was built without it; rebuild with `--features cuda`"
        ));
    }
    Device::new_cuda(ordinal).map_err(|e| format!("cannot open CUDA device {ordinal}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_errors() {
        assert!(matches!(parse_device("cpu"), Ok(Device::Cpu)));
        assert!(parse_device("tpu").unwrap_err().contains("cpu or cuda:N"));
        if !cfg!(feature = "cuda") {
            assert!(
                parse_device("cuda:0")
                    .unwrap_err()
                    .contains("--features cuda")
            );
        }
    }
}
