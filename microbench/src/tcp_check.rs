//! `tcp-check`: the suite's TCP baseline ([`crate::tcp`], acknowledged `SINK`
//! messages) against the plainest send-and-ack loop ([`crate::plain`]), alternating
//! in the same run, so anyone can see that the ceiling every gRPC ratio is read
//! against is as high as raw TCP on this machine.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::plain::PlainServer;
use crate::report::median;
use crate::tcp::{BaselineServer, TcpPeer};
use ps_common::size::format_size;

/// How long to measure.
#[derive(Debug, Clone, Copy)]
pub struct CheckPlan {
    /// Measured time per loop and repetition.
    pub duration: Duration,
    /// Unmeasured time before each loop.
    pub warmup: Duration,
    /// Repetitions (medians are reported).
    pub reps: u32,
}

/// One message size: both loops' medians and how close the baseline comes.
#[derive(Debug, Clone, Serialize)]
pub struct CheckRow {
    /// Message size in bytes.
    pub size_bytes: u64,
    /// The suite's baseline, bytes per second.
    pub baseline_bytes_per_sec: f64,
    /// The plain loop, bytes per second.
    pub plain_bytes_per_sec: f64,
    /// Baseline rate over plain rate (1.0: as fast).
    pub ratio: f64,
    /// The suite's baseline, microseconds per message (a round trip).
    pub baseline_us_per_message: f64,
    /// The plain loop, microseconds per message.
    pub plain_us_per_message: f64,
}

#[derive(Debug, Clone, Copy)]
struct Loop {
    bytes: u64,
    messages: u64,
    seconds: f64,
}

impl Loop {
    fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }

    fn micros_per_message(&self) -> f64 {
        self.seconds * 1e6 / self.messages.max(1) as f64
    }
}

fn baseline_loop(peer: &mut TcpPeer, data: &[u8], length: Duration) -> std::io::Result<Loop> {
    let start = Instant::now();
    let (mut bytes, mut messages) = (0, 0);
    while start.elapsed() < length {
        bytes += peer.sink(data)?;
        messages += 1;
    }
    Ok(Loop {
        bytes,
        messages,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn plain_loop(client: &mut crate::plain::PlainClient, length: Duration) -> std::io::Result<Loop> {
    let start = Instant::now();
    let (bytes, messages) = client.run_for(length)?;
    Ok(Loop {
        bytes,
        messages,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Measures one message size; blocks for about `4 * reps * (duration + warmup)`.
///
/// # Errors
/// When a connection fails.
pub fn measure(size: usize, plan: CheckPlan) -> anyhow::Result<CheckRow> {
    let baseline_server = BaselineServer::start(TcpListener::bind("127.0.0.1:0")?)?;
    let mut baseline = TcpPeer::from_stream(TcpStream::connect(baseline_server.addr())?)?;
    let plain_server = PlainServer::start()?;
    let mut plain = plain_server.client(size)?;
    let data = vec![0x5au8; size];
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    // Which loop goes first alternates (ABBA), so neither gains from its place.
    for rep in 0..plan.reps {
        for plain_turn in [rep % 2 == 1, rep % 2 == 0] {
            if plain_turn {
                plain_loop(&mut plain, plan.warmup)?;
                theirs.push(plain_loop(&mut plain, plan.duration)?);
            } else {
                baseline_loop(&mut baseline, &data, plan.warmup)?;
                ours.push(baseline_loop(&mut baseline, &data, plan.duration)?);
            }
        }
    }
    drop(plain);
    plain_server.join()?;
    let medians = |loops: &[Loop]| {
        let rate = median(&mut loops.iter().map(Loop::rate).collect::<Vec<_>>());
        let micros = median(
            &mut loops
                .iter()
                .map(Loop::micros_per_message)
                .collect::<Vec<_>>(),
        );
        (rate.unwrap_or(0.0), micros.unwrap_or(0.0))
    };
    let (baseline_rate, baseline_us) = medians(&ours);
    let (plain_rate, plain_us) = medians(&theirs);
    Ok(CheckRow {
        size_bytes: size as u64,
        baseline_bytes_per_sec: baseline_rate,
        plain_bytes_per_sec: plain_rate,
        ratio: baseline_rate / plain_rate.max(1e-9),
        baseline_us_per_message: baseline_us,
        plain_us_per_message: plain_us,
    })
}

/// The rows as a table, with whether each is within `tolerance` (0.1: 10%).
pub fn table(rows: &[CheckRow], tolerance: f64) -> String {
    let mut out = format!(
        "{:>8}  {:>13}  {:>13}  {:>6}  {:>14}  {:>14}  within {:.0}%\n",
        "size",
        "baseline GB/s",
        "plain GB/s",
        "ratio",
        "baseline us/msg",
        "plain us/msg",
        tolerance * 100.0
    );
    for row in rows {
        out.push_str(&format!(
            "{:>8}  {:>13.3}  {:>13.3}  {:>6.3}  {:>14.1}  {:>14.1}  {}\n",
            format_size(row.size_bytes as usize),
            row.baseline_bytes_per_sec / 1e9,
            row.plain_bytes_per_sec / 1e9,
            row.ratio,
            row.baseline_us_per_message,
            row.plain_us_per_message,
            if (row.ratio - 1.0).abs() <= tolerance || row.ratio > 1.0 {
                "yes"
            } else {
                "NO"
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_loops_move_bytes_and_the_table_names_every_size() {
        let plan = CheckPlan {
            duration: Duration::from_millis(30),
            warmup: Duration::from_millis(5),
            reps: 1,
        };
        let row = measure(4096, plan).unwrap();
        assert!(row.baseline_bytes_per_sec > 0.0 && row.plain_bytes_per_sec > 0.0);
        assert!(row.ratio.is_finite() && row.ratio > 0.0, "{row:?}");
        let table = table(&[row], 0.1);
        assert!(table.contains("4KiB"), "{table}");
        assert!(table.contains("within 10%"), "{table}");
    }
}
