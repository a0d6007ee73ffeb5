//! `bandwidth`: one-way throughput over gRPC, as unary `Sink` calls or as a
//! `SinkStream` of chunks, against raw TCP in the same run (acknowledged messages
//! for unary, pipelined writes for streams). Each repetition measures gRPC then TCP;
//! the medians are reported.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::try_join_all;
use ps_proto::auth::AuthChannel;
use ps_proto::v1;
use ps_proto::v1::bench_client::BenchClient;

use crate::cpu::process_cpu_seconds;
use crate::payload::{Encoding, build, payload_bytes};
use crate::peer::Peer;
use crate::report::{ResultRow, median};
use crate::tcp::TcpPeer;

/// Unary calls or a chunked stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// One `Sink` call per payload.
    Unary,
    /// The payload as 1-MiB-ish chunks on one `SinkStream`.
    Stream,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Unary => "unary",
            Mode::Stream => "stream",
        })
    }
}

/// How long to measure.
#[derive(Debug, Clone, Copy)]
pub struct BandwidthPlan {
    /// Measured time per repetition.
    pub duration: Duration,
    /// Unmeasured time before each repetition.
    pub warmup: Duration,
    /// Repetitions.
    pub reps: u32,
    /// Bytes per streamed message.
    pub chunk: usize,
}

/// Bytes moved, seconds taken, and CPU seconds used by client and server.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    bytes: u64,
    messages: u64,
    seconds: f64,
    client_cpu: f64,
    server_cpu: f64,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }
}

/// The messages a stream sends for one payload: the payload cut into chunks.
fn stream_messages(sizes: &[usize], encoding: Encoding, chunk: usize) -> Vec<v1::BenchPayload> {
    let mut messages = Vec::new();
    for &size in sizes {
        let mut left = size;
        while left > 0 || messages.is_empty() {
            let n = left.min(chunk);
            messages.push(build(&[n], encoding));
            left -= n;
            if left == 0 {
                break;
            }
        }
    }
    messages
}

async fn unary_loop(
    mut client: BenchClient<AuthChannel>,
    payload: v1::BenchPayload,
    until: Instant,
) -> anyhow::Result<(u64, u64)> {
    let (mut bytes, mut messages) = (0, 0);
    while Instant::now() < until {
        bytes += client.sink(payload.clone()).await?.into_inner().bytes;
        messages += 1;
    }
    Ok((bytes, messages))
}

async fn stream_loop(
    mut client: BenchClient<AuthChannel>,
    messages: Vec<v1::BenchPayload>,
    until: Instant,
) -> anyhow::Result<(u64, u64)> {
    let outgoing = futures::stream::iter(messages.into_iter().cycle())
        .take_while(move |_| std::future::ready(Instant::now() < until));
    let ack = client.sink_stream(outgoing).await?.into_inner();
    Ok((ack.bytes, ack.messages))
}

/// One connection's blocking loop (run on a thread of its own).
fn tcp_loop(
    mut peer: TcpPeer,
    data: Bytes,
    mode: Mode,
    chunk: usize,
    until: Instant,
) -> anyhow::Result<(u64, u64)> {
    let (mut bytes, mut messages) = (0, 0);
    while Instant::now() < until {
        match mode {
            Mode::Unary => bytes += peer.sink(&data)?,
            Mode::Stream => {
                for piece in data.chunks(chunk.max(1)) {
                    peer.stream(piece)?;
                    messages += 1;
                }
            }
        }
        messages += u64::from(mode == Mode::Unary);
    }
    if mode == Mode::Stream {
        bytes = peer.flush()?;
    }
    Ok((bytes, messages))
}

async fn grpc_phase(
    peer: &Peer,
    payload: &v1::BenchPayload,
    messages: &[v1::BenchPayload],
    mode: Mode,
    length: Duration,
) -> anyhow::Result<Sample> {
    let (cpu0, server0, start) = (
        process_cpu_seconds(),
        peer.server_cpu_seconds().await?,
        Instant::now(),
    );
    let until = start + length;
    let loops = peer.clients().into_iter().map(|client| async move {
        match mode {
            Mode::Unary => unary_loop(client, payload.clone(), until).await,
            Mode::Stream => stream_loop(client, messages.to_vec(), until).await,
        }
    });
    let done = try_join_all(loops).await?;
    let seconds = start.elapsed().as_secs_f64();
    let server_cpu = peer.server_cpu_seconds().await? - server0;
    Ok(Sample {
        bytes: done.iter().map(|d| d.0).sum(),
        messages: done.iter().map(|d| d.1).sum(),
        seconds,
        client_cpu: process_cpu_seconds() - cpu0,
        server_cpu,
    })
}

async fn tcp_phase(
    peer: &Peer,
    bytes: usize,
    mode: Mode,
    chunk: usize,
    length: Duration,
) -> anyhow::Result<Sample> {
    let data = Bytes::from(vec![0x5au8; bytes]);
    let peers = peer.tcp_peers().await?;
    let (cpu0, start) = (process_cpu_seconds(), Instant::now());
    let until = start + length;
    let threads = peers.into_iter().map(|p| {
        let data = data.clone();
        tokio::task::spawn_blocking(move || tcp_loop(p, data, mode, chunk, until))
    });
    let done = try_join_all(threads)
        .await?
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Sample {
        bytes: done.iter().map(|d| d.0).sum(),
        messages: done.iter().map(|d| d.1).sum(),
        seconds: start.elapsed().as_secs_f64(),
        client_cpu: process_cpu_seconds() - cpu0,
        server_cpu: 0.0,
    })
}

/// Measures one payload in one mode and encoding.
///
/// # Errors
/// When the peer fails.
pub async fn measure(
    peer: &Peer,
    label: &str,
    sizes: &[usize],
    encoding: Encoding,
    mode: Mode,
    plan: BandwidthPlan,
) -> anyhow::Result<ResultRow> {
    let payload = build(sizes, encoding);
    let bytes = payload_bytes(&payload);
    let messages = stream_messages(sizes, encoding, plan.chunk);
    let (mut grpc, mut tcp) = (Vec::new(), Vec::new());
    for _ in 0..plan.reps {
        grpc_phase(peer, &payload, &messages, mode, plan.warmup).await?;
        grpc.push(grpc_phase(peer, &payload, &messages, mode, plan.duration).await?);
        tcp_phase(peer, bytes, mode, plan.chunk, plan.warmup).await?;
        tcp.push(tcp_phase(peer, bytes, mode, plan.chunk, plan.duration).await?);
    }
    let grpc_rate = median(&mut grpc.iter().map(Sample::rate).collect::<Vec<_>>());
    let tcp_rate = median(&mut tcp.iter().map(Sample::rate).collect::<Vec<_>>());
    let per_gb = |samples: &[Sample], cpu: fn(&Sample) -> f64| {
        let moved: u64 = samples.iter().map(|s| s.bytes).sum();
        Some(samples.iter().map(cpu).sum::<f64>() / (moved as f64 / 1e9).max(1e-12))
    };
    let seconds: f64 = grpc.iter().map(|s| s.seconds).sum();
    let messages_sent: u64 = grpc.iter().map(|s| s.messages).sum();
    Ok(ResultRow {
        bench: "bandwidth".into(),
        mode: Some(mode.to_string()),
        encoding: encoding.to_string(),
        payload: label.to_string(),
        size_bytes: bytes as u64,
        messages: messages_sent,
        throughput_bytes_per_sec: grpc_rate,
        tcp_throughput_bytes_per_sec: tcp_rate,
        ratio_vs_tcp: grpc_rate.zip(tcp_rate).map(|(g, t)| g / t.max(1e-9)),
        rpcs_per_sec: Some(match mode {
            Mode::Unary => messages_sent as f64 / seconds.max(1e-9),
            Mode::Stream => plan.reps as f64 / seconds.max(1e-9),
        }),
        client_cpu_sec_per_gb: per_gb(&grpc, |s| s.client_cpu),
        server_cpu_sec_per_gb: per_gb(&grpc, |s| s.server_cpu),
        tcp_client_cpu_sec_per_gb: per_gb(&tcp, |s| s.client_cpu),
        reps: plan.reps,
        ..ResultRow::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_cut_payloads_into_chunks() {
        let messages = stream_messages(&[2_500_000], Encoding::Bytes, 1 << 20);
        assert_eq!(messages.len(), 3);
        assert_eq!(messages.iter().map(payload_bytes).sum::<usize>(), 2_500_000);
        assert_eq!(
            stream_messages(&[10, 20], Encoding::Bytes, 1 << 20).len(),
            2
        );
    }
}
