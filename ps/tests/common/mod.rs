//! Test helpers: a real `ps-server` on a loopback port, and request builders.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;

use bytes::Bytes;
use ps_proto::chunk::to_wire_chunks;
use ps_proto::codec::DType;
use ps_proto::header::TensorHeader;
use ps_proto::key::ParamKey;
use ps_proto::transport::{MessageLimits, TransportConfig, http_uri};
use ps_proto::v1;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;
use ps_server::ServerConfig;
use ps_server::server::ServeError;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// A server running in this process, and a client connected to it.
pub struct TestServer {
    pub addr: SocketAddr,
    pub client: ParameterServerClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl TestServer {
    /// Binds 127.0.0.1:0, then serves on it; connecting needs no waiting because
    /// the socket is listening before the server task starts.
    pub async fn start(config: ServerConfig) -> Self {
        Self::serve(config, None).await
    }

    /// A server that also serves Prometheus metrics, and the metrics address
    /// (bound before the server starts, as its own address is).
    pub async fn with_metrics(config: ServerConfig) -> (Self, SocketAddr) {
        let metrics = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let metrics_addr = metrics.local_addr().unwrap();
        (Self::serve(config, Some(metrics)).await, metrics_addr)
    }

    async fn serve(config: ServerConfig, metrics: Option<TcpListener>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let task = tokio::spawn(ps_server::run_with_metrics(
            listener,
            metrics,
            config.clone(),
            stopped,
        ));
        let channel = TransportConfig {
            max_message_bytes: usize::MAX,
            ..config.transport
        }
        .endpoint(http_uri(&addr.to_string()))
        .unwrap()
        .connect()
        .await
        .expect("connect to test server");
        let client = ParameterServerClient::new(channel).limit_messages(usize::MAX);
        Self {
            addr,
            client,
            stop: Some(stop),
            task,
        }
    }

    pub async fn default() -> Self {
        Self::start(ServerConfig::default()).await
    }

    /// Triggers shutdown and waits for `run` to return.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task
            .await
            .expect("server task")
            .expect("server ran cleanly");
    }

    /// Triggers shutdown without waiting.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub async fn join(self) -> Result<(), ServeError> {
        self.task.await.expect("server task")
    }

    pub async fn stats(&self) -> v1::StatsResponse {
        self.client
            .clone()
            .stats(v1::StatsRequest {})
            .await
            .unwrap()
            .into_inner()
    }
}

pub fn f32_bytes(values: &[f32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn sgd(lr: f64) -> v1::Optimizer {
    v1::Optimizer {
        kind: Some(v1::optimizer::Kind::Sgd(v1::Sgd {
            lr,
            weight_decay: 0.0,
        })),
    }
}

pub fn adam(lr: f64) -> v1::Optimizer {
    v1::Optimizer {
        kind: Some(v1::optimizer::Kind::Adam(v1::Adam {
            lr,
            ..Default::default()
        })),
    }
}

pub fn spec(name: &str, shape: &[u64], optimizer: v1::Optimizer) -> v1::ParameterSpec {
    v1::ParameterSpec {
        name: name.into(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: shape.to_vec(),
        optimizer: Some(optimizer),
        whole_shape: Vec::new(),
    }
}

pub fn param(name: &str, values: &[f32], optimizer: v1::Optimizer) -> v1::ParameterInit {
    v1::ParameterInit {
        spec: Some(spec(name, &[values.len() as u64], optimizer)),
        initial: f32_bytes(values),
    }
}

/// A key of `elements` f32 values registered without initial data (zeros).
pub fn zeros(name: &str, elements: u64, optimizer: v1::Optimizer) -> v1::ParameterInit {
    v1::ParameterInit {
        spec: Some(spec(name, &[elements], optimizer)),
        initial: Bytes::new(),
    }
}

pub fn tensor(name: &str, values: &[f32]) -> v1::Tensor {
    v1::Tensor {
        name: name.into(),
        part: 0,
        dtype: v1::DType::DtypeF32 as i32,
        shape: vec![values.len() as u64],
        data: f32_bytes(values),
    }
}

pub fn push(worker_id: u32, step: u64, grads: Vec<v1::Tensor>) -> v1::PushRequest {
    v1::PushRequest {
        map_version: 0,
        worker_id,
        step,
        grads,
    }
}

pub fn pull_request(names: &[&str], min_version: u64, timeout_ms: u64) -> v1::PullRequest {
    v1::PullRequest {
        map_version: 0,
        keys: names
            .iter()
            .map(|n| v1::KeyRef {
                name: (*n).into(),
                part: 0,
            })
            .collect(),
        min_version,
        timeout_ms,
        chunk_bytes: 0,
    }
}

impl TestServer {
    pub async fn register(&self, params: Vec<v1::ParameterInit>) -> v1::RegisterResponse {
        self.client
            .clone()
            .register(v1::RegisterRequest {
                map_version: 0,
                restore_version: 0,
                params,
            })
            .await
            .unwrap()
            .into_inner()
    }

    /// The values and version of one f32 key, read without waiting.
    pub async fn values(&self, name: &str) -> (Vec<f32>, u64) {
        let response = self
            .client
            .clone()
            .pull(pull_request(&[name], 0, 0))
            .await
            .unwrap()
            .into_inner();
        let pulled = &response.tensors[0];
        (
            f32_values(&pulled.tensor.as_ref().unwrap().data),
            pulled.version,
        )
    }
}

pub const MIB: usize = 1 << 20;

pub fn header(name: &str, elements: usize) -> TensorHeader {
    TensorHeader {
        key: ParamKey::new(name, 0),
        dtype: DType::F32,
        shape: vec![elements],
    }
}

/// Finite, distinct-looking f32 values with varied bit patterns.
pub fn pattern(elements: usize) -> Bytes {
    let mut data = Vec::with_capacity(elements * 4);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..elements {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let value = (state >> 40) as f32 / 1024.0 - 8192.0;
        data.extend_from_slice(&value.to_le_bytes());
    }
    Bytes::from(data)
}

pub fn register_chunks(
    name: &str,
    data: &Bytes,
    optimizer: v1::Optimizer,
) -> Vec<v1::RegisterChunk> {
    let elements = data.len() / 4;
    to_wire_chunks(
        &header(name, elements),
        data,
        ps_proto::chunk::DEFAULT_CHUNK_BYTES,
    )
    .into_iter()
    .map(|chunk| v1::RegisterChunk {
        map_version: 0,
        restore_version: 0,
        spec: Some(spec(name, &[elements as u64], optimizer)),
        offset: chunk.offset,
        data: chunk.data,
    })
    .collect()
}

pub fn push_chunks(
    worker_id: u32,
    step: u64,
    name: &str,
    data: &Bytes,
    chunk_bytes: usize,
) -> Vec<v1::PushChunk> {
    to_wire_chunks(&header(name, data.len() / 4), data, chunk_bytes)
        .into_iter()
        .map(|chunk| v1::PushChunk {
            map_version: 0,
            worker_id,
            step,
            chunk: Some(chunk),
        })
        .collect()
}

/// A BSP step of two workers on `server` (an idle limit far below a second):
/// worker 0 pushes and pulls the step on the server's own client, and the pull
/// is held for 800 ms, past the limit; then worker 1 pushes through `second`,
/// and the held pull must be answered with the step, its connection kept.
pub async fn a_held_pull_outlasts_the_idle_limit(
    server: &TestServer,
    mut second: ParameterServerClient<Channel>,
) {
    server.register(vec![param("w", &[1.0; 2], sgd(1.0))]).await;
    let mut first = server.client.clone();
    first
        .push(push(0, 0, vec![tensor("w", &[1.0; 2])]))
        .await
        .expect("worker 0's push");
    let held = tokio::spawn(async move { first.pull(pull_request(&["w"], 1, 10_000)).await });
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert!(!held.is_finished(), "the pull waits for worker 1");
    second
        .push(push(1, 0, vec![tensor("w", &[3.0; 2])]))
        .await
        .expect("worker 1's push");
    let pulled = held.await.unwrap().expect("the held pull is answered");
    assert_eq!(pulled.into_inner().tensors[0].version, 1);
}

/// How a test request reaches the server.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    /// A unary call.
    Unary,
    /// The one request of a new `Session` stream.
    Session,
}

/// Both ways in, for tests that must hold on each.
pub const BOTH_WAYS: [Via; 2] = [Via::Unary, Via::Session];

impl TestServer {
    /// `request` as a `Push` call, or on a session stream.
    pub async fn push_via(
        &self,
        via: Via,
        request: v1::PushRequest,
    ) -> Result<v1::PushResponse, tonic::Status> {
        match via {
            Via::Unary => Ok(self.client.clone().push(request).await?.into_inner()),
            Via::Session => match self.on_session(Op::Push(request)).await? {
                Outcome::Push(pushed) => Ok(pushed),
                other => panic!("a push answered with {other:?}"),
            },
        }
    }

    /// `request` as a `Pull` call, or on a session stream.
    pub async fn pull_via(
        &self,
        via: Via,
        request: v1::PullRequest,
    ) -> Result<v1::PullResponse, tonic::Status> {
        match via {
            Via::Unary => Ok(self.client.clone().pull(request).await?.into_inner()),
            Via::Session => match self.on_session(Op::Pull(request)).await? {
                Outcome::Pull(pulled) => Ok(pulled),
                other => panic!("a pull answered with {other:?}"),
            },
        }
    }

    /// Opens a session, sends `op` as its one request, and reads its answer; a
    /// refusal comes back as the status it carries, metadata included.
    async fn on_session(&self, op: Op) -> Result<Outcome, tonic::Status> {
        let request = v1::SessionRequest {
            id: 1,
            deadline_ms: 0,
            op: Some(op),
        };
        let mut answers = self
            .client
            .clone()
            .session(tokio_stream::iter([request]))
            .await?
            .into_inner();
        let answer = answers
            .message()
            .await?
            .expect("an answer before the stream ends");
        assert_eq!(answer.id, 1, "the answer carries the request's id");
        match answer.outcome.expect("an outcome") {
            Outcome::Refusal(refusal) => Err(ps_proto::refusal::status_of(refusal)),
            outcome => Ok(outcome),
        }
    }
}
