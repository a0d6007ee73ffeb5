//! [`ResultRow`]: one measured configuration, printed as a table row, a JSON line
//! (`--json`) or a CSV row (`--out DIR`).
//!
//! `ratio_vs_tcp` is always gRPC's performance as a fraction of raw TCP's in the
//! same run: throughput over throughput for bandwidth rows, TCP's median latency
//! over gRPC's for latency rows. Fields that do not apply are null.

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use ps_common::size::{format_rate, format_size};

use crate::stdout;

/// One measured configuration.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ResultRow {
    /// `latency`, `bandwidth` or `ps-throughput`.
    pub bench: String,
    /// `unary` or `stream` (bandwidth), `bsp` (ps-throughput).
    pub mode: Option<String>,
    /// `bytes` or `floats`.
    pub encoding: String,
    /// The payload: a size such as `16MiB`, a scheme such as `skew x10`, or a model.
    pub payload: String,
    /// Payload bytes per message (per step for ps-throughput).
    pub size_bytes: u64,
    /// Messages (or steps) measured, over all repetitions.
    pub messages: u64,
    /// Median gRPC throughput over the repetitions.
    pub throughput_bytes_per_sec: Option<f64>,
    /// Median raw TCP throughput over the repetitions.
    pub tcp_throughput_bytes_per_sec: Option<f64>,
    /// gRPC as a fraction of TCP.
    pub ratio_vs_tcp: Option<f64>,
    /// RPCs per second (ps-throughput).
    pub rpcs_per_sec: Option<f64>,
    /// gRPC round-trip percentiles, microseconds.
    pub p50_us: Option<f64>,
    /// 90th percentile.
    pub p90_us: Option<f64>,
    /// 99th percentile.
    pub p99_us: Option<f64>,
    /// 99.9th percentile.
    pub p999_us: Option<f64>,
    /// Slowest round trip.
    pub max_us: Option<f64>,
    /// TCP round-trip median, microseconds.
    pub tcp_p50_us: Option<f64>,
    /// TCP 99th percentile.
    pub tcp_p99_us: Option<f64>,
    /// Client CPU seconds (user + system) per GB moved over gRPC.
    pub client_cpu_sec_per_gb: Option<f64>,
    /// Server CPU seconds per GB moved over gRPC.
    pub server_cpu_sec_per_gb: Option<f64>,
    /// Client CPU seconds per GB moved over TCP.
    pub tcp_client_cpu_sec_per_gb: Option<f64>,
    /// Repetitions.
    pub reps: u32,
    /// Per-server load (ps-throughput): bytes held and requests served by each server.
    pub servers: Option<serde_json::Value>,
    /// Share of the simulated workers' time spent pushing (ps-throughput).
    pub push_share: Option<f64>,
    /// Share held by the servers until the step's version existed (ps-throughput).
    pub wait_share: Option<f64>,
    /// Share in the rest of the pulls, the transfer (ps-throughput).
    pub pull_share: Option<f64>,
}

fn us(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| {
        if v >= 1000.0 {
            format!("{:.2}ms", v / 1000.0)
        } else {
            format!("{v:.0}us")
        }
    })
}

fn rate(value: Option<f64>) -> String {
    value.map_or("-".into(), format_rate)
}

fn num(value: Option<f64>, digits: usize) -> String {
    value.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// Prints `rows` as an aligned table.
///
/// # Errors
/// Standard output failed, or was closed early ([`stdout::StdoutClosed`]).
pub fn print_table(rows: &[ResultRow]) -> anyhow::Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let header: Vec<&str>;
    let cells: Vec<Vec<String>> = match first.bench.as_str() {
        "latency" => {
            header = vec![
                "payload", "encoding", "p50", "p90", "p99", "p99.9", "max", "tcp p50", "tcp p99",
                "vs tcp",
            ];
            rows.iter()
                .map(|r| {
                    vec![
                        r.payload.clone(),
                        r.encoding.clone(),
                        us(r.p50_us),
                        us(r.p90_us),
                        us(r.p99_us),
                        us(r.p999_us),
                        us(r.max_us),
                        us(r.tcp_p50_us),
                        us(r.tcp_p99_us),
                        num(r.ratio_vs_tcp, 2),
                    ]
                })
                .collect()
        }
        _ => {
            header = vec![
                "payload",
                "mode",
                "encoding",
                "grpc",
                "tcp",
                "vs tcp",
                "rpc/s",
                "cli cpu s/GB",
                "srv cpu s/GB",
                "tcp cpu s/GB",
            ];
            rows.iter()
                .map(|r| {
                    vec![
                        r.payload.clone(),
                        r.mode.clone().unwrap_or_default(),
                        r.encoding.clone(),
                        rate(r.throughput_bytes_per_sec),
                        rate(r.tcp_throughput_bytes_per_sec),
                        num(r.ratio_vs_tcp, 2),
                        num(r.rpcs_per_sec, 0),
                        num(r.client_cpu_sec_per_gb, 3),
                        num(r.server_cpu_sec_per_gb, 3),
                        num(r.tcp_client_cpu_sec_per_gb, 3),
                    ]
                })
                .collect()
        }
    };
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            cells
                .iter()
                .map(|row| row[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cols: Vec<String>| {
        cols.iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect::<Vec<_>>()
            .join("  ")
    };
    stdout::line(line(header.iter().map(|h| h.to_string()).collect()))?;
    for row in cells {
        stdout::line(line(row))?;
    }
    for r in rows {
        if let (Some(push), Some(wait), Some(pull)) = (r.push_share, r.wait_share, r.pull_share) {
            let other = (1.0 - push - wait - pull).max(0.0);
            stdout::line(format_args!(
                "{}: each worker's time: push {:.0}%, wait {:.0}%, pull {:.0}%, other {:.0}%",
                r.payload,
                push * 100.0,
                wait * 100.0,
                pull * 100.0,
                other * 100.0
            ))?;
        }
    }
    Ok(())
}

/// Prints each row as one JSON object per line.
///
/// # Errors
/// When serialisation fails.
pub fn print_json(rows: &[ResultRow]) -> anyhow::Result<()> {
    for row in rows {
        stdout::line(serde_json::to_string(row)?)?;
    }
    Ok(())
}

/// Writes `rows` as CSV to `path` (the `servers` column as JSON text).
///
/// # Errors
/// When the file cannot be written.
pub fn write_csv(rows: &[ResultRow], path: &Path) -> anyhow::Result<()> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let objects: Vec<serde_json::Map<String, serde_json::Value>> = rows
        .iter()
        .map(|r| match serde_json::to_value(r) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => unreachable!("a ResultRow serialises to an object"),
        })
        .collect();
    let Some(first) = objects.first() else {
        return Ok(());
    };
    let keys: Vec<&String> = first.keys().collect();
    writeln!(
        file,
        "{}",
        keys.iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(",")
    )?;
    for object in &objects {
        let fields: Vec<String> = keys
            .iter()
            .map(|k| match &object[k.as_str()] {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => s.clone(),
                other => {
                    let text = other.to_string();
                    if text.contains(',') {
                        format!("\"{}\"", text.replace('"', "\"\""))
                    } else {
                        text
                    }
                }
            })
            .collect();
        writeln!(file, "{}", fields.join(","))?;
    }
    Ok(())
}

/// A one-line label of a payload of `sizes`: `16MiB`, or `skew x10 (6.1MiB)`.
pub fn payload_label(scheme: Option<String>, sizes: &[usize]) -> String {
    let total: usize = sizes.iter().sum();
    match scheme {
        Some(scheme) => format!("{scheme} x{} ({})", sizes.len(), format_size(total)),
        None => format_size(total),
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn csv_has_a_header_and_one_line_per_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.csv");
        let row = ResultRow {
            bench: "bandwidth".into(),
            payload: "1MiB".into(),
            throughput_bytes_per_sec: Some(1e9),
            ..Default::default()
        };
        write_csv(&[row.clone(), row], &path).unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("bench,mode,encoding,payload"));
        assert!(lines[1].starts_with("bandwidth,,,1MiB"));
    }
}
