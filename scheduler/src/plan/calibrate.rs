//! The plan's inputs measured by the tool itself, instead of given:
//!
//! - `--measure-link ADDR` runs `ps-microbench latency` and `bandwidth`
//!   against a `ps-microbench serve` at ADDR (on a server host): the round
//!   trip and the link's rate from its raw TCP baseline, the time a gRPC
//!   request adds to a round trip, the worker's CPU per byte sent, and the
//!   share of the link a gRPC stream gets.
//! - `--measure-compute` runs `ps-worker --probe-compute` (the MLP of
//!   `--model mlp:...` on a synthetic batch, on this host) for the compute
//!   per step, and `ps-microbench apply` on one core for the optimizer's
//!   apply rate.
//!
//! Both programs are found next to `ps-scheduler`, as they are installed
//! (and built) together. What was measured, and where, goes into the plan
//! file beside the values.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::Value;

/// What `--measure-link` found.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkMeasured {
    /// Raw TCP round trip of 64 bytes, seconds.
    pub rtt: f64,
    /// Raw TCP rate of a 4 MiB stream, bytes per second (each way).
    pub link_bytes_per_sec: f64,
    /// What a gRPC request adds to the raw round trip, seconds.
    pub request_seconds: f64,
    /// Bytes per second of the sender's CPU while streaming.
    pub worker_bytes_per_sec: f64,
    /// Bytes per second of the receiver's (the server's) CPU while
    /// streaming; `None` when the `serve` did not report its CPU.
    pub server_bytes_per_sec: Option<f64>,
    /// The gRPC stream's rate over the raw TCP rate.
    pub link_efficiency: f64,
}

/// The key `--measure-compute` applies: larger than the caches, as a
/// model's values are.
const APPLY_BYTES: &str = "64MiB";

/// Round trips timed for the RTT and the request cost.
const ROUND_TRIPS: &str = "500";

/// Measures the link to the `ps-microbench serve` at `addr`.
///
/// # Errors
/// `ps-microbench` is missing or fails, or reports nothing usable.
pub fn measure_link(addr: &str) -> anyhow::Result<LinkMeasured> {
    let latency = run_json(
        "ps-microbench",
        &[
            "latency",
            "--target",
            addr,
            "--sizes",
            "64B",
            "--count",
            ROUND_TRIPS,
            "--warmup",
            "100",
            "--reps",
            "3",
            "--json",
        ],
    )?;
    let bandwidth = run_json(
        "ps-microbench",
        &[
            "bandwidth",
            "--target",
            addr,
            "--sizes",
            "4MiB",
            "--mode",
            "stream",
            "--seconds",
            "1",
            "--warmup-seconds",
            "0.25",
            "--reps",
            "3",
            "--json",
        ],
    )?;
    link_from(&latency, &bandwidth)
}

/// The link's figures from `ps-microbench`'s JSON rows.
fn link_from(latency: &[Value], bandwidth: &[Value]) -> anyhow::Result<LinkMeasured> {
    let round_trip = row(latency, "latency")?;
    let stream = row(bandwidth, "bandwidth")?;
    let p50 = number(round_trip, "p50_us")? * 1e-6;
    let tcp_p50 = number(round_trip, "tcp_p50_us")? * 1e-6;
    let tcp_rate = number(stream, "tcp_throughput_bytes_per_sec")?;
    let grpc_rate = number(stream, "throughput_bytes_per_sec")?;
    let cpu_per_gb = number(stream, "client_cpu_sec_per_gb")?;
    // An older `serve` reports no CPU of its own: the built-in rate stays.
    let server_cpu_per_gb = number(stream, "server_cpu_sec_per_gb")
        .ok()
        .filter(|&s| s > 0.0);
    Ok(LinkMeasured {
        rtt: tcp_p50,
        link_bytes_per_sec: tcp_rate,
        // A request that came back faster than the raw round trip (noise
        // on a quiet link) costs at least a microsecond, not nothing.
        request_seconds: (p50 - tcp_p50).max(1e-6),
        worker_bytes_per_sec: 1e9 / cpu_per_gb,
        server_bytes_per_sec: server_cpu_per_gb.map(|s| 1e9 / s),
        link_efficiency: (grpc_rate / tcp_rate).min(1.0),
    })
}

/// Seconds of one step's compute of the MLP `widths` (input, hidden..., output)
/// on a batch of `batch` examples, on this host.
///
/// # Errors
/// `ps-worker` is missing or fails, or reports nothing usable.
pub fn measure_compute(widths: &[usize], batch: usize, device: &str) -> anyhow::Result<f64> {
    let [features, hidden @ .., classes] = widths else {
        bail!("--measure-compute needs an MLP with an input and an output width");
    };
    if hidden.is_empty() {
        bail!(
            "--measure-compute times the worker's MLP, which has at least one hidden layer; for mlp:{features},{classes} give --compute"
        );
    }
    let hidden: Vec<String> = hidden.iter().map(usize::to_string).collect();
    let args = vec![
        "--probe-compute".to_string(),
        "--dataset".into(),
        "synthetic".into(),
        "--synthetic-features".into(),
        features.to_string(),
        "--synthetic-classes".into(),
        classes.to_string(),
        // Enough examples for the probe's batches (a warm-up and five timed).
        "--synthetic-train".into(),
        (batch * 8).to_string(),
        "--batch-size".into(),
        batch.to_string(),
        "--hidden".into(),
        hidden.join(","),
        "--device".into(),
        device.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rows = run_json("ps-worker", &args)?;
    number(row(&rows, "probe")?, "step_seconds")
}

/// Bytes of gradient per second `optimizer` (sgd, momentum, adam) takes in
/// on one core of this host: a received gradient is copied out of the
/// socket's buffers, then applied (over a key larger than the caches), so the rate is that of a memcpy and the
/// optimizer's pass one after the other (what `ps-microbench kv --sgd-floor`
/// measures end to end).
///
/// # Errors
/// `ps-microbench` is missing or fails, or reports nothing usable.
pub fn measure_apply(optimizer: &str) -> anyhow::Result<f64> {
    let rows = run_json(
        "ps-microbench",
        &[
            "apply",
            "--size",
            APPLY_BYTES,
            "--reps",
            "3",
            "--runtime-threads",
            "1",
            "--json",
        ],
    )?;
    apply_from(&rows, optimizer)
}

/// The copy-then-apply rate of `optimizer` from `ps-microbench apply`'s rows.
fn apply_from(rows: &[Value], optimizer: &str) -> anyhow::Result<f64> {
    let rate = |pass: &str| {
        let row = rows
            .iter()
            .find(|r| r.get("pass").and_then(Value::as_str) == Some(pass))
            .with_context(|| format!("ps-microbench apply reported no {pass} pass"))?;
        number(row, "key_bytes_per_sec")
    };
    Ok(1.0 / (1.0 / rate("memcpy")? + 1.0 / rate(optimizer)?))
}

/// The MLP widths of a `mlp:IN,HIDDEN...,OUT` model, or why it has none.
///
/// # Errors
/// The model is not an `mlp:` one.
pub fn mlp_widths(model: &str) -> anyhow::Result<Vec<usize>> {
    let Some(widths) = model.strip_prefix("mlp:") else {
        bail!(
            "--measure-compute times the worker's MLP, so it needs --model mlp:IN,HIDDEN...,OUT; for --model {model}, give --compute (a step's forward and backward, measured where the model runs)"
        );
    };
    widths
        .split(',')
        .map(|w| w.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--model mlp:{widths}: widths must be whole numbers"))
}

/// The one JSON row (one object per line) `what` printed.
fn row<'a>(rows: &'a [Value], what: &str) -> anyhow::Result<&'a Value> {
    match rows {
        [only] => Ok(only),
        _ => bail!("expected one result from the {what}, got {}", rows.len()),
    }
}

fn number(row: &Value, field: &str) -> anyhow::Result<f64> {
    row.get(field)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite() && *v > 0.0)
        .with_context(|| format!("the measurement has no positive {field}: {row}"))
}

/// Runs the program `name` (next to this one) with `args`; the JSON objects
/// it printed, one per line.
fn run_json(name: &str, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let program = sibling(name)?;
    let output = Command::new(&program)
        .args(args)
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    if !output.status.success() {
        bail!(
            "{} {} failed ({}): {}",
            program.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).with_context(|| format!("{name} printed {line}")))
        .collect()
}

/// The program `name` installed beside this one.
fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating ps-scheduler")?;
    let path = exe.with_file_name(name);
    if !path.is_file() {
        bail!(
            "measuring runs {name}, which is not beside ps-scheduler ({}); install or build it there (cargo build --release -p {}), or give the values instead",
            path.display(),
            name
        );
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_link_comes_from_the_raw_baseline_and_the_request_from_what_grpc_adds() {
        let latency = [json!({"p50_us": 106.0, "tcp_p50_us": 45.0})];
        let bandwidth = [json!({
            "throughput_bytes_per_sec": 3.5e9,
            "tcp_throughput_bytes_per_sec": 4.0e9,
            "client_cpu_sec_per_gb": 0.25,
            "server_cpu_sec_per_gb": 0.5,
        })];
        let link = link_from(&latency, &bandwidth).unwrap();
        assert!((link.rtt - 45e-6).abs() < 1e-12);
        assert_eq!(link.server_bytes_per_sec, Some(2.0e9));
        assert!((link.request_seconds - 61e-6).abs() < 1e-12);
        assert_eq!(link.link_bytes_per_sec, 4.0e9);
        assert_eq!(link.worker_bytes_per_sec, 4.0e9);
        assert_eq!(link.link_efficiency, 0.875);
    }

    #[test]
    fn a_request_faster_than_the_raw_round_trip_still_costs_a_microsecond() {
        let latency = [json!({"p50_us": 40.0, "tcp_p50_us": 45.0})];
        let bandwidth = [json!({
            "throughput_bytes_per_sec": 5.0e9,
            "tcp_throughput_bytes_per_sec": 4.0e9,
            "client_cpu_sec_per_gb": 0.25,
        })];
        let link = link_from(&latency, &bandwidth).unwrap();
        assert_eq!(link.request_seconds, 1e-6);
        assert_eq!(link.server_bytes_per_sec, None, "no server CPU reported");
        assert_eq!(link.link_efficiency, 1.0);
    }

    #[test]
    fn a_row_without_its_figure_is_named() {
        let latency = [json!({"p50_us": 40.0})];
        let bandwidth = [json!({})];
        let error = link_from(&latency, &bandwidth).unwrap_err().to_string();
        assert!(error.contains("tcp_p50_us"), "{error}");
        let error = link_from(&[], &bandwidth).unwrap_err().to_string();
        assert!(error.contains("one result from the latency"), "{error}");
    }

    #[test]
    fn a_gradient_is_copied_then_applied() {
        let rows = [
            json!({"pass": "memcpy", "key_bytes_per_sec": 15e9}),
            json!({"pass": "sgd", "key_bytes_per_sec": 10e9}),
        ];
        assert!((apply_from(&rows, "sgd").unwrap() - 6e9).abs() < 1.0);
        let error = apply_from(&rows, "adam").unwrap_err().to_string();
        assert!(error.contains("no adam pass"), "{error}");
    }

    #[test]
    fn only_an_mlp_has_widths_to_time() {
        assert_eq!(mlp_widths("mlp:784,128,10").unwrap(), vec![784, 128, 10]);
        let error = mlp_widths("resnet50").unwrap_err().to_string();
        assert!(error.contains("--compute"), "{error}");
        assert!(mlp_widths("mlp:7,x").is_err());
    }
}
