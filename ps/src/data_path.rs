//! [`DataPath`]: the parameter-server service with its two tensor-carrying
//! RPCs, `PushStream` and `PullStream`, served straight from and into HTTP/2
//! data frames.
//!
//! tonic copies every received data frame into one message buffer (growing it
//! as a large chunk arrives) and every sent message into another. Here a push
//! chunk's tensor bytes stay in the frames they arrived in until the optimizer
//! reads them, and a pull chunk's bytes are the stored values themselves, sent
//! behind a few bytes of header. The wire format is unchanged: any gRPC client
//! sees the same messages. Every other RPC goes to tonic's generated service.

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{StreamExt, stream};
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;
use ps_proto::chunk_encode::{framed_message, framed_pull_chunk};
use ps_proto::grpc_frames::{GRPC_CONTENT_TYPE, MessageReader, PULL_STREAM_PATH, PUSH_STREAM_PATH};
use ps_proto::v1;
use ps_proto::v1::parameter_server_server::ParameterServerServer;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;
use tonic::{Code, Status};

use crate::push_source::{FramedPushChunks, refused};
use crate::service::{ParameterService, PullChunks};

/// The `ps.v1.ParameterServer` service, its data path served in place.
#[derive(Debug, Clone)]
pub struct DataPath {
    service: ParameterService,
    generated: ParameterServerServer<ParameterService>,
}

impl DataPath {
    /// `service`, with the configured message limits. Served behind the
    /// access layer: [`ParameterService::into_server`].
    pub(crate) fn new(service: ParameterService) -> Self {
        Self {
            generated: service.clone().generated(),
            service,
        }
    }
}

impl NamedService for DataPath {
    const NAME: &'static str = <ParameterServerServer<ParameterService> as NamedService>::NAME;
}

impl Service<Request<Body>> for DataPath {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let service = self.service.clone();
        match request.uri().path() {
            PUSH_STREAM_PATH => Box::pin(async move { Ok(push_stream(&service, request).await) }),
            PULL_STREAM_PATH => Box::pin(async move { Ok(pull_stream(&service, request).await) }),
            _ => self.generated.call(request),
        }
    }
}

/// `PushStream`, its chunks read out of the request's frames.
async fn push_stream(service: &ParameterService, request: Request<Body>) -> Response<Body> {
    let limit = service.max_message_bytes();
    let request = tonic::Request::from_http(request).map(|body| FramedPushChunks::new(body, limit));
    match service.push_chunks(request).await {
        Ok(answer) => {
            let (metadata, message, _) = answer.into_parts();
            let head = framed_message(&message);
            grpc_response(metadata.into_headers(), stream::iter([head]))
        }
        Err(status) => status.into_http(),
    }
}

/// `PullStream`, each chunk sent as its header and the stored values it shares.
async fn pull_stream(service: &ParameterService, request: Request<Body>) -> Response<Body> {
    let limit = service.max_message_bytes();
    let request = match read_unary::<v1::PullRequest>(request.into_body(), limit).await {
        Ok(request) => request,
        Err(status) => return status.into_http(),
    };
    match service.pull_chunks(&request).await {
        Ok(answer) => {
            let (metadata, chunks, _) = answer.into_parts();
            grpc_response(metadata.into_headers(), pieces_of(chunks))
        }
        Err(status) => status.into_http(),
    }
}

/// The pieces of every chunk, in order, holding the pull's charge until the
/// last is sent.
fn pieces_of(chunks: PullChunks) -> impl futures::Stream<Item = Bytes> + Send + 'static {
    stream::iter(chunks.flat_map(framed_pull_chunk)).filter(|piece| {
        let keep = !piece.is_empty();
        async move { keep }
    })
}

/// A gRPC answer: `headers`, the message bytes of `body`, then an OK status.
fn grpc_response(
    mut headers: HeaderMap,
    body: impl futures::Stream<Item = Bytes> + Send + 'static,
) -> Response<Body> {
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(GRPC_CONTENT_TYPE));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(Code::Ok as i32));
    let frames = body
        .map(|piece| Ok::<_, Status>(Frame::data(piece)))
        .chain(stream::iter([Ok(Frame::trailers(trailers))]));
    let mut response = Response::new(Body::new(StreamBody::new(frames)));
    *response.headers_mut() = headers;
    response
}

/// The one message of a unary request body.
async fn read_unary<M: Message + Default>(mut body: Body, limit: usize) -> Result<M, Status> {
    let mut reader = MessageReader::new(limit);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            reader.push(data);
        }
    }
    let message = reader
        .next_message()
        .map_err(refused)?
        .ok_or_else(|| Status::invalid_argument("the request carried no whole message"))?;
    reader
        .finish()
        .map_err(|_| Status::invalid_argument("the request carried more than its one message"))?;
    M::decode(message.into_bytes())
        .map_err(|e| Status::invalid_argument(format!("the request does not decode: {e}")))
}
