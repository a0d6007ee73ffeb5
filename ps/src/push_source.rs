//! [`FramedPushChunks`]: a `PushStream`'s chunks cut out of the HTTP/2 data
//! frames as they arrived, each chunk's tensor bytes handed on as those frames'
//! own memory; and [`next_message`], a tonic stream's next message within the
//! idle limit (`RegisterStream`'s, which tonic reads).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use ps_proto::chunk_decode::decode_push_chunk;
use ps_proto::grpc_frames::{FrameError, MessageReader};
use ps_proto::v1;
use tonic::body::Body;
use tonic::{Code, Status, Streaming};

use crate::error::{Error, Result};

/// The stream's next message, or `StreamIdle` when none comes within `idle`.
pub(crate) async fn next_message<T: prost::Message + Default>(
    stream: &mut Streaming<T>,
    idle: Duration,
) -> Result<Option<T>> {
    match tokio::time::timeout(idle, stream.message()).await {
        Ok(message) => Ok(message?),
        Err(_) => Err(Error::StreamIdle { idle }),
    }
}

/// The chunks of a `PushStream` request body, read frame by frame.
#[derive(Debug)]
pub(crate) struct FramedPushChunks {
    body: Body,
    reader: MessageReader,
}

impl FramedPushChunks {
    /// Chunks from `body`, refusing messages over `limit` bytes.
    pub(crate) fn new(body: Body, limit: usize) -> Self {
        Self {
            body,
            reader: MessageReader::new(limit),
        }
    }

    /// The next chunk, with its tensor bytes taken out of the message as the
    /// frames' own pieces, or `None` at the end of the stream; ended with
    /// [`Error::StreamIdle`] when nothing arrives for `idle`.
    pub(crate) async fn next_chunk(
        &mut self,
        idle: Duration,
    ) -> Result<Option<(v1::PushChunk, Vec<Bytes>)>> {
        loop {
            if let Some(message) = self.reader.next_message().map_err(refused)? {
                let decoded = decode_push_chunk(message).map_err(|error| {
                    Status::invalid_argument(format!("a PushChunk that does not decode: {error}"))
                })?;
                return Ok(Some(decoded));
            }
            let frame = match tokio::time::timeout(idle, self.body.frame()).await {
                Err(_) => return Err(Error::StreamIdle { idle }),
                Ok(None) => {
                    self.reader.finish().map_err(refused)?;
                    return Ok(None);
                }
                Ok(Some(frame)) => frame?,
            };
            if let Ok(data) = frame.into_data() {
                self.reader.push(data);
            }
        }
    }
}

/// The status for bytes that are not gRPC messages this server takes.
pub(crate) fn refused(error: FrameError) -> Status {
    error.into_status(Code::InvalidArgument)
}
