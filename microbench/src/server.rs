//! The benchmark peer: the `ps.v1.Bench` gRPC service and the raw TCP baseline,
//! served side by side from one process (`ps-microbench serve`), with the gRPC
//! health service beside them.

use std::future::Future;

use futures::stream;
use ps_proto::transport::{MessageLimits, TransportConfig};
use ps_proto::v1;
use ps_proto::v1::bench_server::{Bench, BenchServer};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::cpu::process_cpu_seconds;
use crate::payload::{Encoding, build, payload_bytes};
use crate::tcp::BaselineServer;

/// The `ps.v1.Bench` service.
#[derive(Debug, Clone, Copy)]
pub struct BenchService {
    tcp_port: u16,
}

impl BenchService {
    /// A service that advertises the TCP baseline on `tcp_port`.
    pub fn new(tcp_port: u16) -> Self {
        Self { tcp_port }
    }

    /// The tonic server, accepting messages up to `limit` bytes.
    pub fn into_server(self, limit: usize) -> BenchServer<Self> {
        BenchServer::new(self).limit_messages(limit)
    }
}

fn ack(bytes: usize, messages: u64) -> v1::BenchAck {
    v1::BenchAck {
        bytes: bytes as u64,
        messages,
    }
}

#[tonic::async_trait]
impl Bench for BenchService {
    async fn echo(
        &self,
        request: Request<v1::BenchPayload>,
    ) -> Result<Response<v1::BenchPayload>, Status> {
        Ok(Response::new(request.into_inner()))
    }

    async fn sink(
        &self,
        request: Request<v1::BenchPayload>,
    ) -> Result<Response<v1::BenchAck>, Status> {
        Ok(Response::new(ack(payload_bytes(request.get_ref()), 1)))
    }

    async fn sink_stream(
        &self,
        request: Request<Streaming<v1::BenchPayload>>,
    ) -> Result<Response<v1::BenchAck>, Status> {
        let mut stream = request.into_inner();
        let (mut bytes, mut messages) = (0, 0);
        while let Some(payload) = stream.next().await {
            bytes += payload_bytes(&payload?);
            messages += 1;
        }
        Ok(Response::new(ack(bytes, messages)))
    }

    type SourceStream = stream::Iter<std::iter::RepeatN<Result<v1::BenchPayload, Status>>>;

    async fn source(
        &self,
        request: Request<v1::SourceRequest>,
    ) -> Result<Response<Self::SourceStream>, Status> {
        let request = request.into_inner();
        let sizes: Vec<usize> = request.buffer_sizes.iter().map(|&s| s as usize).collect();
        if sizes.iter().sum::<usize>() > crate::tuning::BENCH_MAX_MESSAGE_BYTES / 2 {
            return Err(Status::invalid_argument(
                "payload larger than half the message limit",
            ));
        }
        let encoding = if request.floats {
            Encoding::Floats
        } else {
            Encoding::Bytes
        };
        let payload = build(&sizes, encoding);
        Ok(Response::new(stream::iter(std::iter::repeat_n(
            Ok(payload),
            request.count as usize,
        ))))
    }

    async fn info(
        &self,
        _request: Request<v1::InfoRequest>,
    ) -> Result<Response<v1::InfoResponse>, Status> {
        Ok(Response::new(v1::InfoResponse {
            tcp_port: u32::from(self.tcp_port),
            cpu_seconds: process_cpu_seconds(),
        }))
    }
}

/// Serves the Bench service on `grpc` and the TCP baseline on `tcp` until `shutdown`.
///
/// # Errors
/// When the gRPC server fails.
pub async fn serve(
    grpc: TcpListener,
    tcp: TcpListener,
    transport: TransportConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let tcp_port = tcp.local_addr()?.port();
    let _baseline = BaselineServer::start(tcp.into_std()?)?;
    let service = BenchService::new(tcp_port).into_server(transport.max_message_bytes);
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<BenchServer<BenchService>>().await;
    let incoming = TcpIncoming::from(grpc).with_nodelay(Some(true));
    transport
        .server()?
        .add_service(health_service)
        .add_service(transport.guarded(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}
