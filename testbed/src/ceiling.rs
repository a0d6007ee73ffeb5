//! The ceiling a job's traffic is read against: raw TCP between a worker host
//! and a server host over the same shaped links, both directions at once (a
//! push's direction and a pull's), each sender writing 1 MiB messages that
//! the receiver acknowledges with one byte each, as `ps-microbench`'s TCP
//! baseline does. The two ends are this binary's hidden `tcp-sink` and
//! `tcp-source` commands, run inside the hosts' namespaces.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::hosts::{Host, Role};
use crate::netns::Network;

/// Bytes per message.
const MESSAGE: usize = 1 << 20;
/// Messages a sender keeps unacknowledged.
const WINDOW: u64 = 4;
/// The port the sinks listen on.
const PORT: u16 = 7100;

/// Takes one connection on `listen`, acknowledges each whole message with one
/// byte until the sender closes, then returns. Says `listening` on stdout once
/// it is.
///
/// # Errors
/// I/O errors of the socket.
pub fn sink(listen: &str) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen)?;
    println!("listening");
    std::io::stdout().flush()?;
    let (mut stream, _) = listener.accept()?;
    let mut buffer = vec![0u8; MESSAGE];
    loop {
        match stream.read_exact(&mut buffer) {
            Ok(()) => stream.write_all(&[1])?,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Sends messages to `connect` for `seconds`, keeping `WINDOW` of them
/// unacknowledged; the acknowledged bytes per second.
///
/// # Errors
/// I/O errors of the socket.
pub fn source(connect: &str, seconds: f64) -> std::io::Result<f64> {
    let mut stream = TcpStream::connect(connect)?;
    let mut acks = stream.try_clone()?;
    let message = vec![7u8; MESSAGE];
    let began = Instant::now();
    let end = began + Duration::from_secs_f64(seconds);
    let (mut sent, mut acked) = (0u64, 0u64);
    let mut ack = [0u8; 1];
    while Instant::now() < end {
        while sent - acked < WINDOW {
            stream.write_all(&message)?;
            sent += 1;
        }
        acks.read_exact(&mut ack)?;
        acked += 1;
    }
    let elapsed = began.elapsed().as_secs_f64();
    while acked < sent {
        acks.read_exact(&mut ack)?;
        acked += 1;
    }
    Ok(acked as f64 * MESSAGE as f64 / elapsed)
}

/// Raw TCP each way between a worker host and a server host, at once.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    /// The worker host measured from.
    pub worker: String,
    /// The host with a server measured to.
    pub server: String,
    /// Worker to server (a push's direction), bytes per second.
    pub up_bytes_per_sec: f64,
    /// Server to worker (a pull's direction), bytes per second.
    pub down_bytes_per_sec: f64,
}

/// Measures [`Ceiling`] between the first host with a server and the first
/// worker host other than it, for `seconds`, with `testbed` (this binary)
/// at both ends.
///
/// # Errors
/// When there is no such pair (one worker with its server beside it), or an
/// end cannot be started or fails.
pub fn measure(network: &Network, testbed: &Path, seconds: f64) -> anyhow::Result<Ceiling> {
    let hosts = network.hosts();
    let server = hosts
        .iter()
        .find(|h| h.serves)
        .cloned()
        .context("the cluster has no server to measure a link to")?;
    let worker = hosts
        .iter()
        .find(|h| h.role == Role::Worker && h.name != server.name)
        .cloned()
        .context(
            "--ceiling: the only worker runs beside the only server, so no link is between them",
        )?;
    let in_ns = |host: &Host, args: &[String]| {
        Command::new("ip")
            .args(["netns", "exec", &network.namespace(host)])
            .arg(testbed)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
    };
    let address = |host: &Host| format!("{}:{PORT}", host.addr);
    let mut sinks = Vec::new();
    for host in [&server, &worker] {
        let mut sink = in_ns(host, &["tcp-sink".into(), "--listen".into(), address(host)])?;
        let mut said = String::new();
        BufReader::new(sink.stdout.as_mut().expect("piped")).read_line(&mut said)?;
        anyhow::ensure!(
            said.trim() == "listening",
            "a TCP sink on {} did not start",
            host.name
        );
        sinks.push(sink);
    }
    let send = |from: &Host, to: &Host| {
        in_ns(
            from,
            &[
                "tcp-source".into(),
                "--connect".into(),
                address(to),
                "--seconds".into(),
                seconds.to_string(),
            ],
        )
    };
    let up = send(&worker, &server)?;
    let down = send(&server, &worker)?;
    let rate = |child: std::process::Child| -> anyhow::Result<f64> {
        let output = child.wait_with_output()?;
        anyhow::ensure!(output.status.success(), "a TCP source failed");
        Ok(String::from_utf8_lossy(&output.stdout).trim().parse()?)
    };
    let ceiling = Ceiling {
        worker: worker.name.clone(),
        server: server.name.clone(),
        up_bytes_per_sec: rate(up)?,
        down_bytes_per_sec: rate(down)?,
    };
    for mut sink in sinks {
        sink.wait()?;
    }
    Ok(ceiling)
}
