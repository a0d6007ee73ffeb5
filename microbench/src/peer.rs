//! [`Peer`]: the benchmark server being measured: a remote one (`--target ADDR`) or
//! a child `ps-microbench serve` process on free loopback ports, stopped afterwards.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use ps_proto::auth::AuthChannel;
use ps_proto::transport::{TransportConfig, http_uri};
use ps_proto::v1;
use ps_proto::v1::bench_client::BenchClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::tcp::TcpPeer;
use crate::tls_files::TlsFiles;
use crate::tuning::Tuning;

/// The line `serve` prints once it listens.
pub const READY_PREFIX: &str = "ps-microbench serving";

/// A benchmark server and connections to it.
pub struct Peer {
    /// Its gRPC address.
    pub grpc_addr: String,
    /// Its TCP baseline address.
    pub tcp_addr: String,
    channels: Vec<BenchClient<AuthChannel>>,
    child: Option<Child>,
    /// The certificates a local TLS server uses, kept for as long as it runs.
    _tls: Option<TlsFiles>,
}

impl Peer {
    /// Connects to `target`, or starts a local server when there is none, over
    /// TLS with certificates made for the run when `tls` is set (local only).
    ///
    /// # Errors
    /// When the server cannot be started or reached.
    pub async fn open(target: Option<&str>, tuning: &Tuning, tls: bool) -> anyhow::Result<Self> {
        let mut transport = tuning.transport()?;
        let tls = tls.then(TlsFiles::new).transpose()?;
        transport.tls = tls.as_ref().map(|t| t.config.clone());
        let (grpc_addr, child) = match target {
            Some(_) if tls.is_some() => {
                anyhow::bail!("--tls makes certificates for a local server; leave out --target")
            }
            Some(addr) => (addr.to_string(), None),
            None => {
                let server_args = tls.iter().flat_map(TlsFiles::server_args).collect();
                let (addr, child) = spawn_local(tuning, server_args).await?;
                (addr, Some(child))
            }
        };
        let mut channels = Vec::new();
        for _ in 0..tuning.connections {
            channels.push(connect(&transport, &grpc_addr).await?);
        }
        let info = channels[0]
            .clone()
            .info(v1::InfoRequest {})
            .await
            .context("asking the peer for its TCP port")?
            .into_inner();
        anyhow::ensure!(
            info.tcp_port != 0,
            "the peer at {grpc_addr} serves no TCP baseline"
        );
        let host = grpc_addr
            .rsplit_once(':')
            .map_or(grpc_addr.as_str(), |(h, _)| h)
            .trim_start_matches("http://");
        let tcp_addr = format!("{host}:{}", info.tcp_port);
        Ok(Self {
            grpc_addr,
            tcp_addr,
            channels,
            child,
            _tls: tls,
        })
    }

    /// The gRPC clients, one per connection.
    pub fn clients(&self) -> Vec<BenchClient<AuthChannel>> {
        self.channels.clone()
    }

    /// TCP baseline connections, as many as gRPC connections.
    ///
    /// # Errors
    /// When a connection fails.
    pub async fn tcp_peers(&self) -> anyhow::Result<Vec<TcpPeer>> {
        let mut peers = Vec::new();
        for _ in 0..self.channels.len() {
            peers.push(
                TcpPeer::connect(&self.tcp_addr).await.with_context(|| {
                    format!("connecting to the TCP baseline at {}", self.tcp_addr)
                })?,
            );
        }
        Ok(peers)
    }

    /// CPU seconds the server process has used.
    ///
    /// # Errors
    /// When the server does not answer.
    pub async fn server_cpu_seconds(&self) -> anyhow::Result<f64> {
        Ok(self.channels[0]
            .clone()
            .info(v1::InfoRequest {})
            .await?
            .into_inner()
            .cpu_seconds)
    }

    /// Stops a local server (a remote one is left running).
    pub async fn close(mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

async fn connect(
    transport: &TransportConfig,
    addr: &str,
) -> anyhow::Result<BenchClient<AuthChannel>> {
    let channel = transport
        .endpoint(http_uri(addr))?
        .connect()
        .await
        .with_context(|| format!("connecting to the benchmark server at {addr}"))?;
    Ok(transport.limited(BenchClient::new(transport.authed(channel))))
}

async fn spawn_local(tuning: &Tuning, extra: Vec<String>) -> anyhow::Result<(String, Child)> {
    let exe = std::env::current_exe().context("locating ps-microbench")?;
    let mut child = Command::new(exe)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tcp-listen",
            "127.0.0.1:0",
        ])
        .args(tuning.to_args())
        .args(extra)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting a local benchmark server")?;
    let mut lines = BufReader::new(child.stdout.take().context("server stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("the local benchmark server did not start within 30s")??
        .context("the local benchmark server exited before listening")?;
    let addr = line
        .strip_prefix(READY_PREFIX)
        .and_then(|rest| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix("grpc="))
        })
        .with_context(|| format!("unexpected first line from the local server: {line}"))?;
    Ok((addr.to_string(), child))
}
