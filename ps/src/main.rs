//! `ps-server`: runs one parameter-server shard.
//!
//! ```text
//! ps-server --listen 0.0.0.0:7070 --workers 2 --consistency bsp
//! ps-server health --server 127.0.0.1:7070
//! ps-server export --checkpoint-dir /var/lib/candle-ps/checkpoints --out model.safetensors
//! ```

use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ps_common::flag::env_flag;
use ps_common::security_args::SecurityArgs;
use ps_common::size::{parse_size, parse_size_u32};
use ps_proto::auth::Role;
use ps_proto::transport::TransportConfig;
use ps_server::budget::default_budget;
use ps_server::checkpointer::CheckpointConfig;
use ps_server::follower::SchedulerLink;
use ps_server::{Consistency, ServerConfig};

/// jemalloc keeps freed buffers for reuse: with the system allocator each
/// message-sized buffer went back to the kernel and came again page by page,
/// which cost 1 MiB pushes a third of their throughput (docs/benchmarks.md).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One candle-ps parameter-server shard: parameters, server-side optimizers,
/// BSP/ASP/SSP consistency, exactly-once pushes, checkpoints.
#[derive(Debug, Parser)]
#[command(name = "ps-server", version)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on.
    #[arg(long, env = "PS_LISTEN", default_value = "0.0.0.0:7070")]
    listen: String,
    /// Also serve gRPC on a Unix-domain socket at this path (mode 0600, removed
    /// when the server stops); workers on this host reach it at unix:PATH.
    #[arg(long, env = "PS_LISTEN_UNIX", value_name = "PATH")]
    listen_unix: Option<std::path::PathBuf>,
    /// Threads serving connections (default: half the cores, at least one).
    /// Updates of large keys run on other threads, one per core. A server with a
    /// machine to itself may serve more connections faster with one per core.
    #[arg(long, env = "PS_RUNTIME_THREADS", value_parser = clap::value_parser!(u16).range(1..))]
    runtime_threads: Option<u16>,
    /// The scheduler to register with and follow (membership, live workers).
    #[arg(long, env = "PS_SCHEDULER")]
    scheduler: Option<String>,
    /// Serve Prometheus metrics (GET /metrics) on this address; off unless set.
    #[arg(long, env = "PS_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// The address workers reach this server at (default: the listen address, with
    /// 127.0.0.1 for an unspecified host).
    #[arg(long, env = "PS_ADVERTISE", conflicts_with = "advertise_hostname")]
    advertise: Option<String>,
    /// Advertise this machine's hostname with the listen port (containers: each
    /// replica of a scaled service is reached by its own hostname).
    #[arg(long, env = "PS_ADVERTISE_HOSTNAME", value_parser = env_flag())]
    advertise_hostname: bool,
    /// Workers in the BSP/SSP group; gradients are averaged over them.
    #[arg(long, env = "PS_WORKERS", default_value_t = 1)]
    workers: u32,
    /// Consistency model: bsp, asp, or ssp:K (K = staleness in steps).
    #[arg(long, env = "PS_CONSISTENCY", default_value = "bsp")]
    consistency: Consistency,
    /// Accept NaN and infinite gradients and initial values instead of refusing them.
    #[arg(long, env = "PS_ALLOW_NON_FINITE", value_parser = env_flag())]
    allow_non_finite: bool,
    /// Largest parameter (or partition) that may be registered, for example 4GiB.
    #[arg(long, alias = "max-tensor-bytes", env = "PS_MAX_TENSOR", value_parser = parse_size, default_value = "4GiB")]
    max_tensor: usize,
    /// Bytes this server may hold, for example 8GiB: keys (values, optimizer
    /// state, BSP accumulator and pull snapshot, charged when registered),
    /// buffered stream data and pulls in flight. Requests past it get
    /// RESOURCE_EXHAUSTED. Default: three quarters of physical memory.
    #[arg(long, env = "PS_MEMORY_BUDGET", value_parser = parse_size)]
    memory_budget: Option<usize>,
    /// Seconds a pull waits for its version when the request names no timeout.
    #[arg(long, env = "PS_PULL_TIMEOUT_SECS", default_value_t = 60)]
    pull_timeout_secs: u64,
    /// The longest wait, in seconds, a pull may ask for.
    #[arg(long, env = "PS_MAX_PULL_TIMEOUT_SECS", default_value_t = 600)]
    max_pull_timeout_secs: u64,
    /// Largest gRPC message accepted or sent.
    #[arg(long, alias = "max-message-bytes", env = "PS_MAX_MESSAGE", value_parser = parse_size, default_value = "4MiB")]
    max_message: usize,
    /// Size of each chunk of a streamed pull.
    #[arg(long, alias = "chunk-bytes", env = "PS_CHUNK", value_parser = parse_size, default_value = "2MiB")]
    chunk: usize,
    /// Checkpoint root: this server writes to `<dir>/<its address>/`, and restores
    /// keys it lacks from any server's newest checkpoint under it (share the folder
    /// between servers so one can take over another's keys).
    #[arg(long, env = "PS_CHECKPOINT_DIR")]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Checkpoint after this many steps (versions) of progress; 0: not by steps.
    #[arg(long, env = "PS_CHECKPOINT_EVERY_STEPS", default_value_t = ps_server::checkpointer::DEFAULT_CHECKPOINT_EVERY_STEPS)]
    checkpoint_every_steps: u64,
    /// Checkpoint after this many seconds when anything changed; 0: not by time.
    #[arg(long, env = "PS_CHECKPOINT_EVERY_SECS", default_value_t = ps_server::checkpointer::DEFAULT_CHECKPOINT_EVERY.as_secs())]
    checkpoint_every_secs: u64,
    /// Seconds shutdown waits for requests in flight before closing connections.
    #[arg(long, env = "PS_SHUTDOWN_GRACE_SECS", default_value_t = 5)]
    shutdown_grace_secs: u64,
    /// End a push or register stream that sends nothing for this long (for
    /// example 30s or 2m), applying nothing of it.
    #[arg(long, default_value = "30s", env = "PS_STREAM_IDLE_TIMEOUT", value_parser = humantime::parse_duration)]
    stream_idle_timeout: Duration,
    /// How long to wait at start for --scheduler to come up, for example 60s or 2m.
    #[arg(long, default_value = "60s", env = "PS_CONNECT_TIMEOUT", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// Bytes of push streams read ahead of applying them, for example 64MiB.
    /// A push stream that finds no room waits, unread, so that memory stays
    /// bounded however many pushes are in flight; one larger than this waits
    /// to have it all.
    #[arg(long, env = "PS_PUSH_BUFFER", value_parser = parse_size, default_value = "16MiB")]
    push_buffer: usize,
    /// HTTP/2 initial stream window. The server takes at most `connection
    /// window / stream window - 1` streams per connection.
    #[arg(long, alias = "stream-window-bytes", env = "PS_STREAM_WINDOW", value_parser = parse_size_u32, default_value = "2MiB")]
    stream_window: u32,
    /// HTTP/2 initial connection window.
    #[arg(long, alias = "connection-window-bytes", env = "PS_CONNECTION_WINDOW", value_parser = parse_size_u32, default_value = "128MiB")]
    connection_window: u32,
    /// HTTP/2 maximum frame size (16KiB to 16MiB-1).
    #[arg(long, alias = "max-frame-bytes", env = "PS_MAX_FRAME", value_parser = parse_size_u32, default_value = "1MiB")]
    max_frame: u32,
    /// Let HTTP/2 size its windows adaptively (overrides the windows).
    #[arg(long, env = "PS_ADAPTIVE_WINDOW", value_parser = env_flag())]
    adaptive_window: bool,
    /// The most connections this server keeps open; more are closed as they come.
    #[arg(long, env = "PS_MAX_CONNECTIONS", default_value_t = ps_proto::transport::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Close a connection that has had no request in flight this long (for
    /// example 5m or 90s; 0 or never: keep it).
    #[arg(long, env = "PS_IDLE_CONNECTION_TIMEOUT", default_value = "5m", value_parser = ps_proto::transport::parse_idle_timeout)]
    idle_connection_timeout: ps_proto::transport::IdleLimit,
    /// Offer workers on this host a shared-memory data path: auto (when the
    /// socket can be made), grpc (never), or shm (fail to start without it).
    #[arg(long, env = "PS_DATA_PATH", default_value = "auto")]
    data_path: ps_shm::DataPathMode,
    /// The largest each of a shared-memory session's two rings may be: a
    /// worker asks for rings sized to what is placed on this server (a few
    /// steps of it, 512 KiB or more) and gets no more than this.
    #[arg(long, env = "PS_SHM_RING", value_parser = parse_size, default_value = "1MiB")]
    shm_ring: usize,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Exit 0 when the server at --server serves (a container health check).
    Health {
        /// The server's address.
        #[arg(long, default_value = "127.0.0.1:7070")]
        server: String,
    },
    /// Write the newest checkpointed parameters under --checkpoint-dir (every
    /// server's folder, any partitioning) as one safetensors file of whole
    /// parameters, which candle's `VarMap::load` reads.
    Export {
        /// The checkpoint root the servers wrote to (or one server's folder in it).
        #[arg(long, env = "PS_CHECKPOINT_DIR")]
        checkpoint_dir: std::path::PathBuf,
        /// The model file to write.
        #[arg(long)]
        out: std::path::PathBuf,
        /// Also write each parameter's optimizer moments, as
        /// `optimizer/<name>/first` and `optimizer/<name>/second`.
        #[arg(long)]
        optimizer_state: bool,
    },
}

/// Runs `ps-server export` and prints what it wrote.
fn export(
    checkpoint_dir: &std::path::Path,
    out: &std::path::Path,
    optimizer_state: bool,
) -> anyhow::Result<()> {
    let exported = ps_server::export::export(checkpoint_dir, out, optimizer_state)?;
    let (oldest, newest) = exported.versions;
    if oldest != newest {
        tracing::warn!(
            oldest,
            newest,
            "the servers checkpointed different versions; the export mixes them (export after the job has ended for one step throughout)"
        );
    }
    println!(
        "wrote {}: {} parameters from {} checkpointed keys at version {}, {} bytes",
        out.display(),
        exported.params,
        exported.keys,
        if oldest == newest {
            newest.to_string()
        } else {
            format!("{oldest}..={newest}")
        },
        exported.bytes
    );
    Ok(())
}

impl Args {
    fn config(&self) -> anyhow::Result<ServerConfig> {
        let mut transport = TransportConfig {
            max_message_bytes: self.max_message,
            stream_window_bytes: self.stream_window,
            connection_window_bytes: self.connection_window,
            max_frame_bytes: self.max_frame,
            adaptive_window: self.adaptive_window,
            max_connections: self.max_connections,
            idle_connection_timeout: self.idle_connection_timeout,
            ..TransportConfig::default()
        };
        self.security.apply(Role::Server, &mut transport)?;
        Ok(ServerConfig {
            consistency: self.consistency,
            workers: self.workers,
            reject_non_finite: !self.allow_non_finite,
            max_tensor_bytes: self.max_tensor,
            memory_budget: self.memory_budget.unwrap_or_else(default_budget),
            default_pull_timeout: Duration::from_secs(self.pull_timeout_secs),
            max_pull_timeout: Duration::from_secs(self.max_pull_timeout_secs),
            chunk_bytes: self.chunk,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            stream_idle_timeout: self.stream_idle_timeout,
            push_buffer_bytes: self.push_buffer,
            scheduler: None,
            checkpoint: None,
            transport,
            shared_memory: self.shared_memory()?,
            unix_socket: self.listen_unix.clone(),
        })
    }

    fn shared_memory(&self) -> anyhow::Result<ps_server::config::SharedMemoryConfig> {
        if self.shm_ring < 4096 || !self.shm_ring.is_multiple_of(8) {
            anyhow::bail!(
                "--shm-ring {} must be at least 4 KiB and a multiple of 8 bytes",
                self.shm_ring
            );
        }
        Ok(ps_server::config::SharedMemoryConfig {
            mode: self.data_path,
            ring_bytes: self.shm_ring as u64,
        })
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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ps_common::runtime::block_on(args.runtime_threads.map(usize::from), serve(args))
        .context("ps-server: cannot start the tokio runtime")?
}

async fn serve(args: Args) -> anyhow::Result<()> {
    ps_common::process::init_tracing();
    let config = args.config().context("ps-server")?;
    match &args.command {
        Some(Command::Health { server }) => {
            std::process::exit(ps_common::health::report(server, &config.transport).await)
        }
        Some(Command::Export {
            checkpoint_dir,
            out,
            optimizer_state,
        }) => return export(checkpoint_dir, out, *optimizer_state),
        None => {}
    }
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
    let metrics = ps_common::metrics::bind(args.metrics_listen.as_deref()).await?;
    let shutdown = ps_common::process::shutdown_signal();
    ps_server::run_with_metrics(listener, metrics, config, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_on_off_flag_takes_one_from_its_variable() {
        let command = <Args as clap::CommandFactory>::command();
        let refusing = ps_common::flag::env_flags_refusing_one(&command);
        assert!(refusing.is_empty(), "{refusing:?}");
    }

    #[test]
    fn size_flags_default_to_the_library_defaults() {
        let config = Args::parse_from(["ps-server"]).config().unwrap();
        assert_eq!(
            config.max_tensor_bytes,
            ps_server::config::DEFAULT_MAX_TENSOR_BYTES
        );
        assert_eq!(config.chunk_bytes, ps_proto::chunk::DEFAULT_CHUNK_BYTES);
        assert_eq!(
            config.push_buffer_bytes,
            ServerConfig::default().push_buffer_bytes
        );
        assert_eq!(config.transport, ServerConfig::default().transport);
    }

    #[test]
    fn sizes_take_units_and_the_byte_spellings_still_work() {
        let config = Args::parse_from([
            "ps-server",
            "--max-tensor",
            "64MiB",
            "--stream-window-bytes",
            "1048576",
            "--max-frame",
            "32KiB",
        ])
        .config()
        .unwrap();
        assert_eq!(config.max_tensor_bytes, 64 << 20);
        assert_eq!(config.transport.stream_window_bytes, 1 << 20);
        assert_eq!(config.transport.max_frame_bytes, 32 << 10);
        let error = Args::try_parse_from(["ps-server", "--stream-window", "8GiB"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("at most 4GiB-1"), "{error}");
    }
}
