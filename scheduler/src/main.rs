//! `ps-scheduler`: runs the cluster's scheduler, or prints its view of the cluster.
//!
//! ```text
//! ps-scheduler --listen 0.0.0.0:7000 --workers 2 --servers 2
//! ps-scheduler --workers 1:16 --join-window-ms 2000   # as many workers as join
//! ps-scheduler status --scheduler 127.0.0.1:7000
//! ps-scheduler health --server 127.0.0.1:7000
//! ```

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use ps_common::certs::{self, ClusterCerts};
use ps_common::flag::env_flag;
use ps_common::rendezvous::{Peer, rendezvous};
use ps_common::security_args::SecurityArgs;
use ps_common::size::parse_size;
use ps_proto::auth::Role;
use ps_proto::consistency::Consistency;
use ps_proto::placement::check_partition_bytes;
use ps_proto::transport::TransportConfig;
use ps_proto::v1;
use ps_proto::v1::scheduler_client::SchedulerClient;
use ps_scheduler::{GroupSize, SchedulerConfig, status_table};

/// How often `status --watch` asks again.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The candle-ps scheduler: membership, shard placement, shard maps and barriers.
#[derive(Debug, Parser)]
#[command(name = "ps-scheduler", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Address to listen on.
    #[arg(long, env = "PS_LISTEN", default_value = "0.0.0.0:7000")]
    listen: String,
    /// Serve Prometheus metrics (GET /metrics) on this address; off unless set.
    #[arg(long, env = "PS_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Workers in the group: N, or MIN:MAX for a group that forms from whoever
    /// registers (at least MIN) until registrations stop for --join-window-ms.
    #[arg(long, env = "PS_WORKERS", default_value = "1")]
    workers: GroupSize,
    /// Milliseconds without a new registration after which an elastic group forms.
    #[arg(long, env = "PS_JOIN_WINDOW_MS", default_value_t = 2000)]
    join_window_ms: u64,
    /// Servers that must register before the first shard map.
    #[arg(long, env = "PS_SERVERS", default_value_t = 1)]
    servers: usize,
    /// Consistency model announced to workers: bsp, asp or ssp:K.
    #[arg(long, env = "PS_CONSISTENCY", default_value = "bsp")]
    consistency: Consistency,
    /// The largest part a parameter is cut into across servers (64KiB to
    /// 4MiB): smaller parts let a pipelined step's pulls start sooner, larger
    /// ones make fewer requests.
    #[arg(long, env = "PS_PARTITION_BYTES", default_value = "1MiB",
          value_parser = |t: &str| parse_size(t).and_then(check_partition_bytes))]
    partition_bytes: usize,
    /// Milliseconds between heartbeats.
    #[arg(long, env = "PS_HEARTBEAT_MS", default_value_t = 500)]
    heartbeat_ms: u64,
    /// Milliseconds of silence after which a node is declared dead.
    #[arg(long, env = "PS_HEARTBEAT_TIMEOUT_MS", default_value_t = 3000)]
    heartbeat_timeout_ms: u64,
    /// Keep the scheduler's state (group, ids, ranks, shard map) in this file, so a
    /// restarted scheduler goes on with the same map instead of starting afresh.
    #[arg(long, env = "PS_STATE_FILE")]
    state_file: Option<std::path::PathBuf>,
    /// Exit once every worker has finished; following servers exit with it.
    #[arg(long, env = "PS_EXIT_WHEN_DONE", value_parser = env_flag())]
    exit_when_done: bool,
    /// The most connections the scheduler keeps open; more are closed as they come.
    #[arg(long, env = "PS_MAX_CONNECTIONS", default_value_t = ps_proto::transport::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Close a connection that has had no request in flight this long (for
    /// example 5m or 90s; 0 or never: keep it).
    #[arg(long, env = "PS_IDLE_CONNECTION_TIMEOUT", default_value = "5m", value_parser = ps_proto::transport::parse_idle_timeout)]
    idle_connection_timeout: ps_proto::transport::IdleLimit,
    #[command(flatten)]
    security: SecurityArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the cluster as the scheduler at --scheduler sees it.
    Status {
        /// The scheduler's address.
        #[arg(
            long,
            alias = "server",
            default_value = "127.0.0.1:7000",
            env = "PS_SCHEDULER"
        )]
        scheduler: String,
        /// How long to wait for the scheduler to answer, for example 3s.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        connect_timeout: Duration,
        /// Refresh the table every second, with pushes/s, MB/s and steps/s,
        /// until Ctrl-C.
        #[arg(long)]
        watch: bool,
    },
    /// Plan a setup for a model on a cluster: every candidate's predicted
    /// step time and its terms, the fastest that fits chosen
    /// (docs/plan.md).
    Plan(Box<ps_scheduler::plan::cli::PlanArgs>),
    /// Print a plan file's chosen setup as the variables the compose and
    /// swarm settings read (PS_SERVERS, PS_CONSISTENCY, PS_NO_PIPELINE,
    /// PS_BACKWARD_SEGMENTS, PS_WIRE_DTYPE, PS_PARTITION_BYTES,
    /// PS_REQUESTS_PER_SERVER), one NAME=value a line:
    /// `scripts/cluster.sh up --plan FILE` runs it.
    PlanEnv(ps_scheduler::plan::apply::PlanEnvArgs),
    /// Exit 0 when the scheduler at --server serves (a container health check).
    Health {
        /// The scheduler's address.
        #[arg(long, default_value = "127.0.0.1:7000")]
        server: String,
    },
    /// Write a new CA and a node certificate for a cluster into --out: ca.pem
    /// (for --tls-ca and --tls-client-ca), node.pem and node-key.pem (for
    /// --tls-cert/--tls-key and --tls-client-cert/--tls-client-key), and
    /// ca-key.pem (keep it off the cluster's machines).
    Certs {
        /// The folder to write the four files to.
        #[arg(long)]
        out: std::path::PathBuf,
        /// More names the node certificate carries (host names or IP addresses),
        /// besides candle-ps, localhost and 127.0.0.1.
        #[arg(long = "name", value_name = "NAME")]
        names: Vec<String>,
        /// Days the certificates are valid.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Also write a random cluster token into --out/token (for --token-file).
        #[arg(long, conflicts_with = "role_tokens")]
        token: bool,
        /// Also write a cluster token with roles: --out/token with a server and a
        /// worker secret (for the scheduler and the servers) and
        /// --out/worker-token with the worker's only (for the workers).
        #[arg(long)]
        role_tokens: bool,
        /// Leave the folder as it is when it already holds a CA (a restarted
        /// cluster keeps the certificates its running processes trust).
        #[arg(long)]
        keep: bool,
    },
}

/// What `ps-scheduler certs` was asked for.
struct CertsRequest<'a> {
    out: &'a std::path::Path,
    names: &'a [String],
    days: u32,
    token: bool,
    role_tokens: bool,
    keep: bool,
}

/// Runs `ps-scheduler certs` and says what it wrote.
fn write_certs(request: CertsRequest<'_>) -> anyhow::Result<()> {
    let CertsRequest {
        out,
        names,
        days,
        token,
        role_tokens,
        keep,
    } = request;
    if keep && out.join(certs::CA_CERT_FILE).exists() {
        println!("kept the certificates in {}", out.display());
        return Ok(());
    }
    let cluster = ClusterCerts::generate(names, days).context("cannot make the certificates")?;
    let mut written = cluster
        .write(out)
        .with_context(|| format!("cannot write the certificates to {}", out.display()))?;
    if token {
        let secret = certs::random_token().context("cannot read the system's random source")?;
        written.push(certs::write_token(out, &secret).context("cannot write the token")?);
    }
    if role_tokens {
        written.extend(certs::write_role_tokens(out).context("cannot write the role tokens")?);
    }
    for path in written {
        println!("wrote {}", path.display());
    }
    println!(
        "valid for {days} days; start every process with --tls-ca {0}/ca.pem --tls-cert {0}/node.pem --tls-key {0}/node-key.pem",
        out.display()
    );
    Ok(())
}

/// Prints the cluster as the scheduler at `scheduler` sees it, once, or with
/// `watch` every second (with the rates in between) until Ctrl-C.
async fn status(
    scheduler: &str,
    transport: &TransportConfig,
    wait: Duration,
    watch: bool,
) -> anyhow::Result<()> {
    let (_, channel) = rendezvous(scheduler, &[Peer::Scheduler], transport, wait).await?;
    let mut client = SchedulerClient::new(transport.authed(channel));
    let mut ask = async move || {
        let asked = Instant::now();
        let answer = client.status(v1::StatusRequest {}).await.map_err(|s| {
            anyhow::anyhow!(
                "the scheduler at {scheduler} refused Status: {:?}: {}",
                s.code(),
                s.message()
            )
        })?;
        Ok::<_, anyhow::Error>((answer.into_inner(), asked))
    };
    let (mut shown, mut asked) = ask().await?;
    if !watch {
        print!("{}", status_table::render(&shown, None));
        return Ok(());
    }
    let on_terminal = std::io::stdout().is_terminal();
    let mut earlier: Option<(v1::StatusResponse, Duration)> = None;
    let mut ticks = tokio::time::interval(WATCH_EVERY);
    ticks.tick().await;
    // One Ctrl-C listener for the whole watch: a new one each round would
    // miss a Ctrl-C that lands while a table is fetched or printed, and the
    // first one has already taken the signal's default (ending the process).
    let mut interrupted = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        let before = earlier
            .as_ref()
            .map(|(status, elapsed)| status_table::Earlier {
                status,
                elapsed: *elapsed,
            });
        let table = status_table::render(&shown, before);
        if on_terminal {
            // Clear the screen and draw from its top corner.
            println!("\x1b[2J\x1b[H{table}(every {WATCH_EVERY:?}; Ctrl-C stops)");
        } else {
            println!("{table}");
        }
        std::io::stdout().flush()?;
        tokio::select! {
            _ = ticks.tick() => {}
            _ = &mut interrupted => return Ok(()),
        }
        let (next, now) = tokio::select! {
            answer = ask() => answer?,
            _ = &mut interrupted => return Ok(()),
        };
        earlier = Some((std::mem::replace(&mut shown, next), now - asked));
        asked = now;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    ps_common::process::init_tracing();
    let mut transport = TransportConfig {
        max_connections: cli.max_connections,
        idle_connection_timeout: cli.idle_connection_timeout,
        ..TransportConfig::default()
    };
    cli.security.apply(Role::Server, &mut transport)?;
    match &cli.command {
        Some(Command::Status {
            scheduler,
            connect_timeout,
            watch,
        }) => return status(scheduler, &transport, *connect_timeout, *watch).await,
        Some(Command::Plan(args)) => return args.run(),
        Some(Command::PlanEnv(args)) => return args.run(),
        Some(Command::Health { server }) => {
            std::process::exit(ps_common::health::report(server, &transport).await);
        }
        Some(Command::Certs {
            out,
            names,
            days,
            token,
            role_tokens,
            keep,
        }) => {
            return write_certs(CertsRequest {
                out,
                names,
                days: *days,
                token: *token,
                role_tokens: *role_tokens,
                keep: *keep,
            });
        }
        None => {}
    }
    let config = SchedulerConfig {
        workers: cli.workers,
        join_window: Duration::from_millis(cli.join_window_ms),
        exit_when_done: cli.exit_when_done,
        state_file: cli.state_file.clone(),
        min_servers: cli.servers,
        consistency: cli.consistency,
        partition_bytes: cli.partition_bytes,
        heartbeat_interval: Duration::from_millis(cli.heartbeat_ms),
        heartbeat_timeout: Duration::from_millis(cli.heartbeat_timeout_ms),
        transport,
        ..SchedulerConfig::default()
    };
    config.validate().map_err(anyhow::Error::msg)?;
    let listener = tokio::net::TcpListener::bind(&cli.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cli.listen))?;
    let metrics = ps_common::metrics::bind(cli.metrics_listen.as_deref()).await?;
    let shutdown = ps_common::process::shutdown_signal();
    ps_scheduler::run_with_metrics(listener, metrics, config, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_on_off_flag_takes_one_from_its_variable() {
        let command = <Cli as clap::CommandFactory>::command();
        let refusing = ps_common::flag::env_flags_refusing_one(&command);
        assert!(refusing.is_empty(), "{refusing:?}");
    }
}
