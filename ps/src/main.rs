//! `ps-server`: runs one parameter-server shard.
//!
//! ```text
//! ps-server --listen 0.0.0.0:7070 --workers 2 --consistency bsp
//! ps-server health --server 127.0.0.1:7070
//! ```

use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ps_proto::transport::TransportConfig;
use ps_server::checkpointer::CheckpointConfig;
use ps_server::follower::SchedulerLink;
use ps_server::{Consistency, ServerConfig};

/// One candle-ps parameter-server shard.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on.
    #[arg(long, env = "PS_LISTEN", default_value = "0.0.0.0:7070")]
    listen: String,
    /// The scheduler to register with and follow (membership, live workers).
    #[arg(long, env = "PS_SCHEDULER")]
    scheduler: Option<String>,
    /// The address workers reach this server at (default: the listen address, with
    /// 127.0.0.1 for an unspecified host).
    #[arg(long, env = "PS_ADVERTISE", conflicts_with = "advertise_hostname")]
    advertise: Option<String>,
    /// Advertise this machine's hostname with the listen port (containers: each
    /// replica of a scaled service is reached by its own hostname).
    #[arg(long, env = "PS_ADVERTISE_HOSTNAME")]
    advertise_hostname: bool,
    /// Workers in the BSP/SSP group; gradients are averaged over them.
    #[arg(long, env = "PS_WORKERS", default_value_t = 1)]
    workers: u32,
    /// Consistency model: bsp, asp, or ssp:K (K = staleness in steps).
    #[arg(long, env = "PS_CONSISTENCY", default_value = "bsp")]
    consistency: Consistency,
    /// Accept NaN and infinite gradients and initial values instead of refusing them.
    #[arg(long, env = "PS_ALLOW_NON_FINITE")]
    allow_non_finite: bool,
    /// Largest parameter (or partition) that may be registered, in bytes.
    #[arg(long, env = "PS_MAX_TENSOR_BYTES", default_value_t = ps_server::config::DEFAULT_MAX_TENSOR_BYTES)]
    max_tensor_bytes: usize,
    /// Seconds a pull waits for its version when the request names no timeout.
    #[arg(long, env = "PS_PULL_TIMEOUT_SECS", default_value_t = 60)]
    pull_timeout_secs: u64,
    /// The longest wait, in seconds, a pull may ask for.
    #[arg(long, env = "PS_MAX_PULL_TIMEOUT_SECS", default_value_t = 600)]
    max_pull_timeout_secs: u64,
    /// Largest gRPC message accepted or sent, in bytes.
    #[arg(long, env = "PS_MAX_MESSAGE_BYTES", default_value_t = ps_proto::transport::DEFAULT_MAX_MESSAGE_BYTES)]
    max_message_bytes: usize,
    /// Bytes per chunk of streamed pulls.
    #[arg(long, env = "PS_CHUNK_BYTES", default_value_t = ps_proto::chunk::DEFAULT_CHUNK_BYTES)]
    chunk_bytes: usize,
    /// Checkpoint root: this server writes to `<dir>/<its address>/`, and restores
    /// keys it lacks from any server's newest checkpoint under it (share the folder
    /// between servers so one can take over another's keys).
    #[arg(long, env = "PS_CHECKPOINT_DIR")]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Checkpoint after this many steps (versions) of progress; 0: not by steps.
    #[arg(long, env = "PS_CHECKPOINT_EVERY_STEPS", default_value_t = 50)]
    checkpoint_every_steps: u64,
    /// Checkpoint after this many seconds when anything changed; 0: not by time.
    #[arg(long, env = "PS_CHECKPOINT_EVERY_SECS", default_value_t = 30)]
    checkpoint_every_secs: u64,
    /// Seconds shutdown waits for requests in flight before closing connections.
    #[arg(long, env = "PS_SHUTDOWN_GRACE_SECS", default_value_t = 5)]
    shutdown_grace_secs: u64,
    /// How long to wait at start for --scheduler to come up, for example 60s or 2m.
    #[arg(long, default_value = "60s", env = "PS_CONNECT_TIMEOUT", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// HTTP/2 initial stream window, in bytes.
    #[arg(long, default_value_t = TransportConfig::default().stream_window_bytes)]
    stream_window_bytes: u32,
    /// HTTP/2 initial connection window, in bytes.
    #[arg(long, default_value_t = TransportConfig::default().connection_window_bytes)]
    connection_window_bytes: u32,
    /// HTTP/2 maximum frame size, in bytes.
    #[arg(long, default_value_t = TransportConfig::default().max_frame_bytes)]
    max_frame_bytes: u32,
    /// Let HTTP/2 size its windows adaptively.
    #[arg(long)]
    adaptive_window: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Exit 0 when the server at --server serves (a container health check).
    Health {
        /// The server's address.
        #[arg(long, default_value = "127.0.0.1:7070")]
        server: String,
    },
}

impl Args {
    fn config(&self) -> ServerConfig {
        let transport = TransportConfig {
            max_message_bytes: self.max_message_bytes,
            stream_window_bytes: self.stream_window_bytes,
            connection_window_bytes: self.connection_window_bytes,
            max_frame_bytes: self.max_frame_bytes,
            adaptive_window: self.adaptive_window,
            ..TransportConfig::default()
        };
        ServerConfig {
            consistency: self.consistency,
            workers: self.workers,
            reject_non_finite: !self.allow_non_finite,
            max_tensor_bytes: self.max_tensor_bytes,
            default_pull_timeout: Duration::from_secs(self.pull_timeout_secs),
            max_pull_timeout: Duration::from_secs(self.max_pull_timeout_secs),
            chunk_bytes: self.chunk_bytes,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            scheduler: None,
            checkpoint: None,
            transport,
        }
    }
}

/// The address workers reach this server at: the flag, else the hostname (when
/// asked) or the listen address, with a loopback host when it listens on every
/// interface.
fn advertised(args: &Args, local: std::net::SocketAddr) -> anyhow::Result<String> {
    if let Some(addr) = &args.advertise {
        return Ok(addr.clone());
    }
    if args.advertise_hostname {
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::env::var("HOSTNAME").map_err(std::io::Error::other))
            .context("--advertise-hostname: cannot read this machine's hostname")?;
        return Ok(format!("{}:{}", hostname.trim(), local.port()));
    }
    Ok(if local.ip().is_unspecified() {
        format!("127.0.0.1:{}", local.port())
    } else {
        local.to_string()
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ps_proto::process::init_tracing();
    if let Some(Command::Health { server }) = &args.command {
        std::process::exit(ps_proto::health::report(server).await);
    }
    let config = args.config();
    config
        .validate()
        .map_err(anyhow::Error::msg)
        .context("ps-server")?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let mut config = config;
    let advertise = advertised(&args, listener.local_addr()?)?;
    if let Some(root) = &args.checkpoint_dir {
        config.checkpoint = Some(CheckpointConfig {
            root: root.clone(),
            folder: ps_server::checkpoint::folder_name(&advertise),
            every_steps: args.checkpoint_every_steps,
            every: Duration::from_secs(args.checkpoint_every_secs),
        });
    }
    if let Some(scheduler) = &args.scheduler {
        config.scheduler = Some(SchedulerLink {
            scheduler: scheduler.clone(),
            advertise,
            connect_timeout: args.connect_timeout,
        });
    }
    ps_server::run(listener, config, ps_proto::process::shutdown_signal()).await?;
    Ok(())
}
