//! `latency`: ping-pong round trips over gRPC (`Echo`) and raw TCP, with
//! percentiles from an HDR histogram.

use std::time::Instant;

use hdrhistogram::Histogram;

use crate::payload::{Encoding, build, payload_bytes};
use crate::peer::Peer;
use crate::report::ResultRow;
use crate::tcp::TcpPeer;

/// How many round trips to measure.
#[derive(Debug, Clone, Copy)]
pub struct LatencyPlan {
    /// Round trips per repetition.
    pub count: u64,
    /// Unmeasured round trips before each repetition.
    pub warmup: u64,
    /// Repetitions.
    pub reps: u32,
}

/// A measured latency configuration and its histograms, for plots.
pub struct LatencyResult {
    /// The summary row.
    pub row: ResultRow,
    /// gRPC round trips, microseconds.
    pub grpc: Histogram<u64>,
    /// TCP round trips, microseconds.
    pub tcp: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn micros(start: Instant) -> u64 {
    (start.elapsed().as_nanos() / 1000).max(1) as u64
}

/// Runs `round_trip` `n` times, recording each one's microseconds in `record`.
async fn timed(
    n: u64,
    mut record: Option<&mut Histogram<u64>>,
    mut round_trip: impl AsyncFnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    for _ in 0..n {
        let start = Instant::now();
        round_trip().await?;
        if let Some(h) = record.as_deref_mut() {
            h.saturating_record(micros(start));
        }
    }
    Ok(())
}

/// Runs the TCP round trips of one repetition on a thread of their own (the
/// baseline's calls block), returning the connection and the histogram.
async fn tcp_round_trips(
    mut tcp: TcpPeer,
    mut hist: Histogram<u64>,
    raw: &[u8],
    plan: LatencyPlan,
) -> anyhow::Result<(TcpPeer, Histogram<u64>)> {
    let raw = raw.to_vec();
    tokio::task::spawn_blocking(move || {
        for n in 0..plan.warmup + plan.count {
            let start = Instant::now();
            tcp.echo(&raw)?;
            if n >= plan.warmup {
                hist.saturating_record(micros(start));
            }
        }
        Ok((tcp, hist))
    })
    .await?
}

/// Measures round trips of a payload of `sizes` in `encoding`, gRPC and TCP
/// alternating per repetition.
///
/// # Errors
/// When the peer fails.
pub async fn measure(
    peer: &Peer,
    label: &str,
    sizes: &[usize],
    encoding: Encoding,
    plan: LatencyPlan,
) -> anyhow::Result<LatencyResult> {
    let payload = build(sizes, encoding);
    let bytes = payload_bytes(&payload);
    let raw = vec![0x5au8; bytes];
    let client = peer.clients().remove(0);
    let mut tcp = peer.tcp_peers().await?.remove(0);
    let (mut grpc_hist, mut tcp_hist) = (histogram(), histogram());
    for _ in 0..plan.reps {
        let grpc_echo = async || {
            client
                .clone()
                .echo(payload.clone())
                .await
                .map(drop)
                .map_err(anyhow::Error::from)
        };
        timed(plan.warmup, None, grpc_echo).await?;
        timed(plan.count, Some(&mut grpc_hist), grpc_echo).await?;
        (tcp, tcp_hist) = tcp_round_trips(tcp, tcp_hist, &raw, plan).await?;
    }
    let q = |h: &Histogram<u64>, q: f64| Some(h.value_at_quantile(q) as f64);
    let row = ResultRow {
        bench: "latency".into(),
        encoding: encoding.to_string(),
        payload: label.to_string(),
        size_bytes: bytes as u64,
        messages: grpc_hist.len(),
        p50_us: q(&grpc_hist, 0.5),
        p90_us: q(&grpc_hist, 0.9),
        p99_us: q(&grpc_hist, 0.99),
        p999_us: q(&grpc_hist, 0.999),
        max_us: Some(grpc_hist.max() as f64),
        tcp_p50_us: q(&tcp_hist, 0.5),
        tcp_p99_us: q(&tcp_hist, 0.99),
        ratio_vs_tcp: Some(
            tcp_hist.value_at_quantile(0.5) as f64 / grpc_hist.value_at_quantile(0.5).max(1) as f64,
        ),
        reps: plan.reps,
        ..ResultRow::default()
    };
    Ok(LatencyResult {
        row,
        grpc: grpc_hist,
        tcp: tcp_hist,
    })
}
