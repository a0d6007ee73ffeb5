//! [`Loopback`]: a real `ps-server` service in this process, reached over
//! in-memory duplex streams instead of sockets, that a test can kill and restart
//! empty behind its clients' backs.

use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use ps_server::config::ServerConfig;
use ps_server::service::ParameterService;
use ps_server::store::Store;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Server};

/// A parameter server in this process. Each connection the client opens goes
/// through a relay to the current incarnation; [`Loopback::restart`] kills it
/// (its relays end, so its connections drop as a killed process's do) and
/// starts an empty one, as a server restarted without checkpoints.
#[derive(Clone)]
pub struct Loopback {
    config: ServerConfig,
    current: Arc<Mutex<Incarnation>>,
}

struct Incarnation {
    connections: Option<mpsc::UnboundedSender<Result<DuplexStream, std::io::Error>>>,
    stop: CancellationToken,
    relays: Vec<tokio::task::JoinHandle<()>>,
}

impl Incarnation {
    /// Ends this incarnation at once: open connections drop, new ones are refused.
    fn kill(&mut self) {
        self.stop.cancel();
        self.connections.take();
        for relay in self.relays.drain(..) {
            relay.abort();
        }
    }
}

impl Loopback {
    /// Starts a server with `config`.
    pub fn start(config: ServerConfig) -> Self {
        Self {
            current: Arc::new(Mutex::new(Self::serve(config.clone()))),
            config,
        }
    }

    fn serve(config: ServerConfig) -> Incarnation {
        let store = Arc::new(Store::new(config.store_rules(), CancellationToken::new()));
        let service = ParameterService::new(store, config, None).into_server();
        let (connections, incoming) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(
            Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    UnboundedReceiverStream::new(incoming),
                    stopped.cancelled_owned(),
                ),
        );
        Incarnation {
            connections: Some(connections),
            stop,
            relays: Vec::new(),
        }
    }

    /// Kills the server and starts an empty one in its place.
    ///
    /// # Panics
    /// When a previous holder of the lock panicked.
    pub fn restart(&self) {
        let mut current = self.current.lock().unwrap();
        current.kill();
        *current = Self::serve(self.config.clone());
    }

    /// Kills the server for good: new connections are refused.
    ///
    /// # Panics
    /// When a previous holder of the lock panicked.
    pub fn stop(&self) {
        self.current.lock().unwrap().kill();
    }

    fn connect(&self) -> std::io::Result<DuplexStream> {
        let (client, mut client_side) = tokio::io::duplex(1 << 20);
        let (mut server_side, server) = tokio::io::duplex(1 << 20);
        let mut current = self.current.lock().unwrap();
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "stopped");
        let connections = current.connections.as_ref().ok_or_else(refused)?;
        connections.send(Ok(server)).map_err(|_| refused())?;
        current.relays.push(tokio::spawn(async move {
            let _ = tokio::io::copy_bidirectional(&mut client_side, &mut server_side).await;
        }));
        Ok(client)
    }

    /// A channel whose every connection reaches the current server.
    pub fn channel(&self) -> Channel {
        let server = self.clone();
        Endpoint::from_static("http://loopback:1").connect_with_connector_lazy(tower::service_fn(
            move |_| {
                let server = server.clone();
                async move { server.connect().map(TokioIo::new) }
            },
        ))
    }
}
