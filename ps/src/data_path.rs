//! [`DataPath`]: the parameter-server service with its tensor-carrying RPCs,
//! `PushStream`, `PullStream` and `Session`, served straight from and into
//! HTTP/2 data frames.
//!
//! tonic copies every received data frame into one message buffer (growing it
//! as a large chunk arrives) and every sent message into another. Here a push
//! chunk's tensor bytes stay in the frames they arrived in until the optimizer
//! reads them, and a pull chunk's bytes are the stored values themselves, sent
//! behind a few bytes of header; a session's requests are decoded out of the
//! frames they arrived in and a row pull's rows are sent as they were read out
//! of the table. The wire format is unchanged: any gRPC client sees the same
//! messages. Every other RPC goes to tonic's generated service.

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
use ps_proto::grpc_frames::{
    GRPC_CONTENT_TYPE, MessageReader, PULL_STREAM_PATH, PUSH_STREAM_PATH, SESSION_PATH,
};
use ps_proto::session_body::{Ending, SessionBody};
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
            SESSION_PATH => Box::pin(async move { Ok(session(&service, request)) }),
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

/// `Session`: its requests decoded out of the frames they arrive in, its
/// answers written by a [`SessionBody`] (a row pull's rows as they are; the
/// small pieces of the answers ready at once joined into one frame, as
/// tonic's encoder does, in a buffer kept for the stream), the stream ended
/// with the status that ended the session.
fn session(service: &ParameterService, request: Request<Body>) -> Response<Body> {
    let limit = service.max_message_bytes();
    let requests = session_requests(request.into_body(), limit);
    let answered = crate::session::open(service, requests);
    let mut response = Response::new(Body::new(SessionBody::new(answered, Ending::Trailers)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(GRPC_CONTENT_TYPE));
    response
}

/// The session requests in `body`, each decoded out of the frames it arrived
/// in; the stream ends after the first that is refused.
fn session_requests(
    body: Body,
    limit: usize,
) -> impl futures::Stream<Item = Result<v1::SessionRequest, Status>> + Send + Unpin + 'static {
    let reading = Some((body, MessageReader::new(limit)));
    Box::pin(stream::unfold(reading, |reading| async move {
        let (mut body, mut reader) = reading?;
        loop {
            match reader.next_message() {
                Ok(Some(message)) => {
                    return match v1::SessionRequest::decode(message) {
                        Ok(request) => Some((Ok(request), Some((body, reader)))),
                        Err(e) => {
                            let message = format!("a session request does not decode: {e}");
                            Some((Err(Status::invalid_argument(message)), None))
                        }
                    };
                }
                Ok(None) => {}
                Err(error) => return Some((Err(refused(error)), None)),
            }
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        reader.push(data);
                    }
                }
                Some(Err(status)) => return Some((Err(status), None)),
                None => return reader.finish().err().map(|e| (Err(refused(e)), None)),
            }
        }
    }))
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

#[cfg(test)]
mod tests {
    use super::*;
    use ps_proto::chunk_encode::framed_message;
    use ps_proto::grpc_frames::message_prefix;

    /// A request body of `frames`.
    fn body_of(frames: Vec<Bytes>) -> Body {
        let frames = stream::iter(frames.into_iter().map(|f| Ok::<_, Status>(Frame::data(f))));
        Body::new(StreamBody::new(frames))
    }

    fn request(id: u64) -> v1::SessionRequest {
        v1::SessionRequest {
            id,
            deadline_ms: 0,
            op: Some(v1::session_request::Op::Pull(v1::PullRequest::default())),
        }
    }

    #[tokio::test]
    async fn session_requests_are_read_across_frames_and_end_at_one_that_does_not_decode() {
        let whole = [framed_message(&request(1)), framed_message(&request(2))].concat();
        let (first, second) = whole.split_at(3);
        let garbage = [&message_prefix(2)[..], &[0xff, 0xff]].concat();
        let frames = vec![
            Bytes::copy_from_slice(first),
            Bytes::copy_from_slice(second),
            Bytes::from(garbage),
            framed_message(&request(3)),
        ];
        let mut requests = session_requests(body_of(frames), 1 << 20);
        assert_eq!(requests.next().await.unwrap().unwrap(), request(1));
        assert_eq!(requests.next().await.unwrap().unwrap(), request(2));
        let refused = requests.next().await.unwrap().unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("does not decode"), "{refused:?}");
        assert!(requests.next().await.is_none(), "nothing is read after it");
    }

    #[tokio::test]
    async fn a_session_request_cut_short_or_over_the_limit_is_refused() {
        let whole = framed_message(&request(1));
        let cut = whole.slice(..whole.len() - 1);
        let mut requests = session_requests(body_of(vec![cut]), 1 << 20);
        let truncated = requests.next().await.unwrap().unwrap_err();
        assert_eq!(truncated.code(), Code::InvalidArgument, "{truncated:?}");
        assert!(requests.next().await.is_none());

        let mut requests = session_requests(body_of(vec![whole]), 2);
        let too_large = requests.next().await.unwrap().unwrap_err();
        assert!(too_large.message().contains("too large"), "{too_large:?}");
        assert!(requests.next().await.is_none());
    }
}
