//! [`LocalServers`]: parameter servers started in this process, each on its own
//! loopback port (bound before the server starts, so clients can connect at once),
//! and stopped cleanly together.

use std::net::SocketAddr;

use ps_client::ClientError;
use ps_client::{ClientConfig, PsClient};
use ps_proto::transport::TransportConfig;
use ps_server::ServerConfig;
use ps_server::checkpointer::CheckpointConfig;
use ps_server::follower::SchedulerLink;
use ps_server::server::ServeError;
use ps_shm::DataPathMode;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::metrics_ports::MetricsPorts;

struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ServeError>>,
}

/// Parameter servers running in this process.
pub struct LocalServers {
    servers: Vec<Running>,
    transport: TransportConfig,
}

impl LocalServers {
    /// Starts `count` servers with `config` on `127.0.0.1:0` ports.
    ///
    /// # Errors
    /// When a port cannot be bound.
    pub async fn start(count: usize, config: ServerConfig) -> std::io::Result<Self> {
        Self::start_following(count, config, None).await
    }

    /// Starts `count` servers that register with (and follow) the scheduler at
    /// `scheduler`, when one is given.
    ///
    /// # Errors
    /// When a port cannot be bound.
    pub async fn start_following(
        count: usize,
        config: ServerConfig,
        scheduler: Option<&str>,
    ) -> std::io::Result<Self> {
        Self::start_with_metrics(count, config, scheduler, &mut MetricsPorts::new(None)).await
    }

    /// [`LocalServers::start_following`], each server also serving its
    /// metrics on the next of `metrics` ports.
    ///
    /// # Errors
    /// When a port cannot be bound.
    pub async fn start_with_metrics(
        count: usize,
        config: ServerConfig,
        scheduler: Option<&str>,
        metrics: &mut MetricsPorts,
    ) -> std::io::Result<Self> {
        let mut servers = Vec::with_capacity(count);
        for index in 0..count {
            let metrics = metrics.next(&format!("server {index}")).await?;
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let (stop, stopped) = oneshot::channel::<()>();
            let shutdown = async {
                let _ = stopped.await;
            };
            let link = scheduler.map(|s| SchedulerLink {
                scheduler: s.to_string(),
                advertise: addr.to_string(),
                connect_timeout: ps_server::follower::DEFAULT_CONNECT_TIMEOUT,
            });
            // Each server checkpoints into a folder of its own under the root.
            let checkpoint = config.checkpoint.clone().map(|c| CheckpointConfig {
                folder: ps_server::checkpoint::folder_name(&addr.to_string()),
                ..c
            });
            let config = ServerConfig {
                scheduler: link,
                checkpoint,
                ..config.clone()
            };
            let task = tokio::spawn(ps_server::run_with_metrics(
                listener, metrics, config, shutdown,
            ));
            servers.push(Running { addr, stop, task });
        }
        Ok(Self {
            servers,
            transport: config.transport,
        })
    }

    /// The servers' addresses, in order.
    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.to_string()).collect()
    }

    /// A client connected to every server, with the servers' transport (and TLS).
    ///
    /// # Errors
    /// [`ClientError::Connect`] if a server is gone.
    pub async fn client(&self) -> Result<PsClient, ClientError> {
        self.client_taking(DataPathMode::Auto).await
    }

    /// [`LocalServers::client`], reaching the servers by `data_path`.
    ///
    /// # Errors
    /// [`ClientError::Connect`] if a server is gone.
    pub async fn client_taking(&self, data_path: DataPathMode) -> Result<PsClient, ClientError> {
        self.client_with(ClientConfig {
            data_path,
            ..ClientConfig::new(self.addrs())
        })
        .await
    }

    /// A client of `config` (its addresses and transport replaced by these
    /// servers' own).
    ///
    /// # Errors
    /// [`ClientError::Connect`] if a server is gone.
    pub async fn client_with(&self, config: ClientConfig) -> Result<PsClient, ClientError> {
        PsClient::connect(ClientConfig {
            transport: self.transport.clone(),
            ..ClientConfig {
                servers: self.addrs(),
                ..config
            }
        })
        .await
    }

    /// Stops every server and waits for each to finish.
    ///
    /// # Errors
    /// The first server that failed.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let tasks: Vec<_> = self
            .servers
            .into_iter()
            .map(|s| {
                let _ = s.stop.send(());
                s.task
            })
            .collect();
        for task in tasks {
            task.await
                .map_err(|e| ServeError::Config(format!("server task failed: {e}")))??;
        }
        Ok(())
    }
}

/// `servers` BSP servers for a group of `workers`, for tests.
///
/// # Panics
/// When loopback ports cannot be bound.
pub async fn test_cluster(servers: usize, workers: u32) -> LocalServers {
    let config = ServerConfig {
        workers,
        ..ServerConfig::default()
    };
    LocalServers::start(servers, config)
        .await
        .expect("bind loopback ports for a test cluster")
}
