//! [`start_framed`]: one gRPC call whose request body is written, and whose
//! answer is read, as HTTP/2 data frames, without tonic's codec: a push sends
//! each gradient chunk's own bytes behind a few bytes of header, and a pull
//! hands each chunk's values on as the frames they arrived in, to be written
//! once, into the caller's buffer.
//!
//! The messages are the same `ps.v1` messages any gRPC client sends; only the
//! copies are gone. The call goes through the same channel, token and
//! timeouts as every other call.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, TE};
use http::{Method, Request, StatusCode, Uri, Version};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use ps_proto::auth::AuthChannel;
use ps_proto::grpc_frames::{FrameError, GRPC_CONTENT_TYPE, MessageReader};
use ps_proto::rope::Rope;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

/// Calls `path` (`/package.Service/Method`) on `channel` with `metadata` and
/// the request body `pieces` (whole framed messages, in order), and waits for
/// the answer's headers.
///
/// # Errors
/// The status the server answered before any message (a refusal), or a
/// transport failure as tonic reports it, or an answer that is not gRPC.
pub(crate) async fn start_framed(
    channel: AuthChannel,
    path: &'static str,
    metadata: MetadataMap,
    pieces: Vec<Bytes>,
    limit: usize,
) -> Result<FramedAnswer, Status> {
    let body = Body::new(Pieces::new(pieces));
    start_framed_body(channel, path, metadata, body, limit).await
}

/// [`start_framed`] with a request body that may still be written as the
/// answer is read (a stream of messages, as a `Session`'s).
///
/// # Errors
/// As [`start_framed`].
pub(crate) async fn start_framed_body(
    mut channel: AuthChannel,
    path: &'static str,
    metadata: MetadataMap,
    body: Body,
    limit: usize,
) -> Result<FramedAnswer, Status> {
    let mut request = Request::new(body);
    *request.method_mut() = Method::POST;
    *request.uri_mut() = Uri::from_static(path);
    *request.version_mut() = Version::HTTP_2;
    *request.headers_mut() = metadata.into_headers();
    let headers = request.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(GRPC_CONTENT_TYPE));
    headers.insert(TE, HeaderValue::from_static("trailers"));

    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|error| Status::from_error(error.into()))?;
    let response = channel
        .call(request)
        .await
        .map_err(|error| Status::from_error(error.into()))?;
    let (parts, body) = response.into_parts();
    if parts.status != StatusCode::OK {
        return Err(Status::unknown(format!(
            "the server answered HTTP {} instead of gRPC",
            parts.status
        )));
    }
    // A status among the headers is a trailers-only answer: no message follows.
    let ended = match Status::from_header_map(&parts.headers) {
        Some(status) if status.code() != Code::Ok => return Err(status),
        Some(_) => true,
        None => false,
    };
    Ok(FramedAnswer {
        metadata: MetadataMap::from_headers(parts.headers),
        body: Body::new(body),
        reader: MessageReader::new(limit),
        ended,
    })
}

/// A request body of pieces known in advance. It says it has ended as soon as
/// its last piece is taken, so that HTTP/2 marks the last data frame as the
/// stream's end instead of sending an empty frame (and, often, a write of its
/// own) after it.
struct Pieces {
    queue: VecDeque<Bytes>,
    remaining: u64,
}

impl Pieces {
    fn new(pieces: Vec<Bytes>) -> Self {
        let queue: VecDeque<Bytes> = pieces.into_iter().filter(|p| !p.is_empty()).collect();
        let remaining = queue.iter().map(|p| p.len() as u64).sum();
        Self { queue, remaining }
    }
}

impl http_body::Body for Pieces {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let piece = this.queue.pop_front().map(|piece| {
            this.remaining -= piece.len() as u64;
            Ok(Frame::data(piece))
        });
        Poll::Ready(piece)
    }

    fn is_end_stream(&self) -> bool {
        self.queue.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// The answer of a call begun by [`start_framed`], read message by message.
#[derive(Debug)]
pub(crate) struct FramedAnswer {
    metadata: MetadataMap,
    body: Body,
    reader: MessageReader,
    ended: bool,
}

impl FramedAnswer {
    /// The answer's metadata.
    pub(crate) fn metadata(&self) -> &MetadataMap {
        &self.metadata
    }

    /// The next message, as the frame pieces it arrived in; `None` once the
    /// answer ended with an OK status.
    ///
    /// # Errors
    /// The status the answer ended with, a broken transport, or bytes that are
    /// not gRPC messages.
    pub(crate) async fn next_message(&mut self) -> Result<Option<Rope>, Status> {
        loop {
            let truncated = |e: FrameError| e.into_status(Code::Internal);
            if let Some(message) = self.reader.next_message().map_err(truncated)? {
                return Ok(Some(message));
            }
            if self.ended {
                return Ok(None);
            }
            let Some(frame) = self.body.frame().await else {
                return Err(Status::internal(
                    "the answer ended without trailers, so without a status",
                ));
            };
            let trailers = match frame?.into_data() {
                Ok(data) => {
                    self.reader.push(data);
                    continue;
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => trailers,
                    Err(_) => continue,
                },
            };
            self.reader.finish().map_err(truncated)?;
            match Status::from_header_map(&trailers) {
                Some(status) if status.code() == Code::Ok => self.ended = true,
                Some(status) => return Err(status),
                None => {
                    return Err(Status::internal(
                        "the answer's trailers carry no grpc-status",
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pieces_end_with_their_last_piece_and_say_their_size() {
        let mut body = Pieces::new(vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from_static(b"de"),
        ]);
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(5));
        assert!(!http_body::Body::is_end_stream(&body));
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"abc");
        assert!(!http_body::Body::is_end_stream(&body), "one piece is left");
        let last = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&last[..], b"de", "the empty piece is skipped");
        assert!(
            http_body::Body::is_end_stream(&body),
            "ended as soon as the last piece is taken, so it carries END_STREAM"
        );
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(0));
        assert!(body.frame().await.is_none());
    }

    #[test]
    fn a_body_of_no_pieces_has_ended_before_it_starts() {
        let body = Pieces::new(vec![Bytes::new()]);
        assert!(http_body::Body::is_end_stream(&body));
    }
}
