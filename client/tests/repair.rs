//! Placement repair without sockets: a real `ps-server` service in this process,
//! reached over in-memory duplex streams, restarted empty behind the client's
//! back; the client classifies the failure and restores the keys from the
//! worker's copy, and a repair that cannot help ends within its budget.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hyper_util::rt::TokioIo;
use ps_client::placement::ParamInfo;
use ps_client::retry::RetryPolicy;
use ps_client::{ClientConfig, ClientError, LocalCopy, PsClient, Recovery, RepairBudget, sgd};
use ps_proto::codec::DType;
use ps_proto::consistency::Consistency;
use ps_proto::ids::{Rank, Step, Version};
use ps_server::config::ServerConfig;
use ps_server::service::ParameterService;
use ps_server::store::Store;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Endpoint, Server};

/// A parameter server in this process. Each connection the client opens goes
/// through a relay to the current incarnation; [`Loopback::restart`] kills it
/// (its relays end, so its connections drop as a killed process's do) and
/// starts an empty one, as a server restarted without checkpoints.
#[derive(Clone)]
struct Loopback {
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
    fn start() -> Self {
        Self {
            current: Arc::new(Mutex::new(Self::serve())),
        }
    }

    fn serve() -> Incarnation {
        let config = ServerConfig {
            consistency: Consistency::Asp,
            workers: 1,
            ..ServerConfig::default()
        };
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

    fn restart(&self) {
        let mut current = self.current.lock().unwrap();
        current.kill();
        *current = Self::serve();
    }

    /// Kills the server for good: new connections are refused.
    fn stop(&self) {
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

    fn channel(&self) -> tonic::transport::Channel {
        let server = self.clone();
        Endpoint::from_static("http://loopback:1").connect_with_connector_lazy(tower::service_fn(
            move |_| {
                let server = server.clone();
                async move { server.connect().map(TokioIo::new) }
            },
        ))
    }
}

/// Little-endian `f32` bytes, as the wire carries them.
fn f32s(values: &[f32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

async fn client(server: &Loopback) -> PsClient {
    let mut config = ClientConfig::new(vec!["loopback:1".into()]);
    config.retry = RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
    };
    let mut client = PsClient::over_channels(config, vec![("loopback:1".into(), server.channel())]);
    let info = ParamInfo {
        name: "w".into(),
        shape: vec![4],
        dtype: DType::F32,
    };
    client.place(&[info]).await.expect("place");
    client
}

fn copy(values: &[f32], version: u64) -> LocalCopy {
    LocalCopy {
        values: vec![("w".into(), f32s(values))],
        version: Version(version),
        optimizer: sgd(1.0),
    }
}

/// A client of `server` with `w` registered at ones; the copy it registered.
async fn registered(server: &Loopback) -> (PsClient, LocalCopy) {
    let client = client(server).await;
    let initial = copy(&[1.0; 4], 0);
    let created = client
        .register(&initial.values, &initial.optimizer)
        .await
        .unwrap();
    assert!(created, "a fresh server takes the values");
    (client, initial)
}

async fn pull_w(client: &PsClient) -> (Vec<f32>, u64) {
    let pulled = client
        .pull(Version(0))
        .await
        .expect("pull")
        .remove("w")
        .unwrap();
    (pulled.values, pulled.version.get())
}

#[tokio::test]
async fn a_server_restarted_empty_gets_the_keys_back_from_the_workers_copy() {
    let server = Loopback::start();
    let (mut client, _) = registered(&server).await;
    client
        .push(Rank(0), Step(0), &[("w".into(), f32s(&[0.5; 4]))])
        .await
        .unwrap();
    let (values, version) = pull_w(&client).await;
    assert_eq!((values.as_slice(), version), (&[0.5; 4][..], 1));

    server.restart();
    let grads = [("w".into(), f32s(&[0.25; 4]))];
    let error = client.push(Rank(0), Step(1), &grads).await.unwrap_err();
    assert_eq!(error.recovery(Step(1)), Recovery::KeysMissing, "{error}");
    let mut budget = RepairBudget::default();
    let held = copy(&values, version);
    client
        .recover(error, Step(1), &mut budget, &held)
        .await
        .expect("repaired");
    assert_eq!(client.push(Rank(0), Step(1), &grads).await.unwrap(), 1);
    assert_eq!(
        pull_w(&client).await,
        (vec![0.25; 4], 2),
        "restored at version 1, then step 1"
    );
}

#[tokio::test]
async fn a_server_gone_for_good_ends_the_repair_within_its_budget() {
    let server = Loopback::start();
    let (mut client, initial) = registered(&server).await;
    server.stop();
    let grads = [("w".into(), f32s(&[0.5; 4]))];
    let error = client.push(Rank(0), Step(0), &grads).await.unwrap_err();
    assert_eq!(error.recovery(Step(0)), Recovery::ServerLost, "{error}");
    let mut budget = RepairBudget::default();
    let gave_up = client
        .recover(error, Step(0), &mut budget, &initial)
        .await
        .unwrap_err();
    assert_eq!(gave_up.recovery(Step(0)), Recovery::ServerLost, "{gave_up}");
    assert!(
        client
            .recover(gave_up, Step(0), &mut budget, &initial)
            .await
            .is_err(),
        "budget spent"
    );
}

#[tokio::test]
async fn a_request_error_is_not_repaired() {
    let server = Loopback::start();
    let (mut client, initial) = registered(&server).await;
    let wrong = [("w".into(), f32s(&[f32::NAN; 4]))];
    let error = client.push(Rank(0), Step(0), &wrong).await.unwrap_err();
    assert!(matches!(error, ClientError::Rpc { .. }));
    assert_eq!(error.recovery(Step(0)), Recovery::Fatal, "{error}");
    let mut budget = RepairBudget::default();
    let returned = client
        .recover(error, Step(0), &mut budget, &initial)
        .await
        .unwrap_err();
    assert_eq!(returned.recovery(Step(0)), Recovery::Fatal);
    assert_eq!(budget, RepairBudget::default(), "no repair was spent");
}
