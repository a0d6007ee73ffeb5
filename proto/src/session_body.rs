//! A `Session` stream's body, as either end sends it: the messages queued on
//! a channel written as HTTP/2 data frames by one [`SessionFrames`] kept for
//! the stream's life. The messages queued at once go out together (up to
//! [`MESSAGES_JOINED`] of them), and the buffer they are written into is
//! reused once its frames are sent, so a stream of small operations writes
//! its messages without allocating. A server's answers end with trailers
//! carrying the status that ended the session.

use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;
use http::header::CONTENT_TYPE;
use http_body::{Body, Frame};
use tokio::sync::mpsc;
use tonic::Status;

use crate::session_frames::SessionFrames;
use crate::v1;

/// The most messages taken off the channel before their frames are sent
/// (`SessionFrames` also cuts a piece at 256 KiB of joined bytes).
pub const MESSAGES_JOINED: usize = 64;

/// One item queued for a session body.
pub trait Queued {
    /// Writes the item into `frames`; `Err` ends the stream with that status
    /// instead.
    ///
    /// # Errors
    /// The status the item carries.
    fn write(self, frames: &mut SessionFrames) -> Result<(), Status>;
}

impl Queued for v1::SessionRequest {
    fn write(self, frames: &mut SessionFrames) -> Result<(), Status> {
        frames.put_request(self);
        Ok(())
    }
}

impl Queued for Result<v1::SessionAnswer, Status> {
    fn write(self, frames: &mut SessionFrames) -> Result<(), Status> {
        frames.put_answer(self?);
        Ok(())
    }
}

/// How a body ends once its channel closes or an item ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// With the end of the data (a client's requests).
    Plain,
    /// With trailers carrying the status (a server's answers).
    Trailers,
}

/// The body of a session stream: see the module's documentation.
#[derive(Debug)]
pub struct SessionBody<T> {
    queued: mpsc::Receiver<T>,
    frames: SessionFrames,
    ending: Ending,
    /// The status that ended the stream, once it has; its trailers are sent
    /// after the last data frame.
    ended: Option<Status>,
    done: bool,
}

impl<T: Queued> SessionBody<T> {
    /// The body of the messages queued on `queued`.
    pub fn new(queued: mpsc::Receiver<T>, ending: Ending) -> Self {
        Self {
            queued,
            frames: SessionFrames::default(),
            ending,
            ended: None,
            done: false,
        }
    }

    /// Writes what is queued now, up to [`MESSAGES_JOINED`] items; `Pending`
    /// when nothing is (the task is woken when something is).
    fn take_queued(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut taken = 0;
        while taken < MESSAGES_JOINED {
            match self.queued.poll_recv(cx) {
                Poll::Ready(Some(item)) => {
                    taken += 1;
                    if let Err(status) = item.write(&mut self.frames) {
                        self.end(status);
                        break;
                    }
                }
                Poll::Ready(None) => {
                    self.end(Status::ok(""));
                    break;
                }
                Poll::Pending if taken == 0 => return Poll::Pending,
                Poll::Pending => break,
            }
        }
        self.frames.flush();
        Poll::Ready(())
    }

    fn end(&mut self, status: Status) {
        self.queued.close();
        self.ended = Some(status);
    }
}

impl<T: Queued + Unpin> Body for SessionBody<T> {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(piece) = this.frames.next_piece() {
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(status) = this.ended.take() {
                this.done = true;
                return Poll::Ready(match this.ending {
                    Ending::Plain => None,
                    Ending::Trailers => Some(Ok(Frame::trailers(trailers_of(status)))),
                });
            }
            if this.take_queued(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// The trailers ending a stream with `status`, its message and metadata kept.
pub fn trailers_of(status: Status) -> HeaderMap {
    let mut trailers = status.into_http::<()>().into_parts().0.headers;
    trailers.remove(CONTENT_TYPE);
    trailers
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message;
    use tonic::Code;

    use super::*;
    use crate::grpc_frames::MessageReader;

    /// The next frame of `body`, waiting for it.
    async fn next_frame<T: Queued + Unpin>(body: &mut SessionBody<T>) -> Option<Frame<Bytes>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx))
            .await
            .map(|frame| frame.expect("a session body never fails"))
    }

    fn answer(id: u64) -> v1::SessionAnswer {
        v1::SessionAnswer {
            id,
            pull_waited_us: id * 10,
            ..Default::default()
        }
    }

    /// The answers in `data`, read back as a peer reads them.
    fn answers_in(data: Bytes) -> Vec<v1::SessionAnswer> {
        let mut reader = MessageReader::new(1 << 20);
        reader.push(data);
        let mut answers = Vec::new();
        while let Some(message) = reader.next_message().expect("whole messages") {
            answers.push(v1::SessionAnswer::decode(message).expect("decodes"));
        }
        reader.finish().expect("nothing left over");
        answers
    }

    #[tokio::test]
    async fn answers_queued_at_once_share_a_frame_and_the_stream_ends_with_ok_trailers() {
        let (answers, queued) = mpsc::channel(8);
        let mut body = SessionBody::new(queued, Ending::Trailers);
        for id in 1..=3 {
            answers.send(Ok(answer(id))).await.unwrap();
        }
        let data = next_frame(&mut body).await.unwrap().into_data().unwrap();
        assert_eq!(answers_in(data), vec![answer(1), answer(2), answer(3)]);
        drop(answers);
        let trailers = next_frame(&mut body)
            .await
            .unwrap()
            .into_trailers()
            .unwrap();
        assert_eq!(Status::from_header_map(&trailers).unwrap().code(), Code::Ok);
        assert!(next_frame(&mut body).await.is_none());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn a_refusal_ends_the_stream_with_its_status_after_the_answers_before_it() {
        let (answers, queued) = mpsc::channel(8);
        let mut body = SessionBody::new(queued, Ending::Trailers);
        answers.send(Ok(answer(1))).await.unwrap();
        let refusal = Status::resource_exhausted("over the budget");
        answers.send(Err(refusal)).await.unwrap();
        answers.send(Ok(answer(2))).await.unwrap();
        let data = next_frame(&mut body).await.unwrap().into_data().unwrap();
        assert_eq!(answers_in(data), vec![answer(1)]);
        let trailers = next_frame(&mut body)
            .await
            .unwrap()
            .into_trailers()
            .unwrap();
        let status = Status::from_header_map(&trailers).unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "over the budget");
        assert!(next_frame(&mut body).await.is_none());
        assert!(
            answers.send(Ok(answer(3))).await.is_err(),
            "the queue is closed"
        );
    }

    #[tokio::test]
    async fn requests_end_without_trailers_when_their_queue_closes() {
        let (requests, queued) = mpsc::channel(8);
        let mut body = SessionBody::new(queued, Ending::Plain);
        let request = v1::SessionRequest {
            id: 7,
            ..Default::default()
        };
        requests.send(request.clone()).await.unwrap();
        drop(requests);
        let data = next_frame(&mut body).await.unwrap().into_data().unwrap();
        let mut reader = MessageReader::new(1 << 20);
        reader.push(data);
        let message = reader.next_message().unwrap().unwrap();
        assert_eq!(v1::SessionRequest::decode(message).unwrap(), request);
        assert!(next_frame(&mut body).await.is_none());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn a_frame_sent_and_dropped_gives_its_buffer_back_to_the_next() {
        let (answers, queued) = mpsc::channel(8);
        let mut body = SessionBody::new(queued, Ending::Trailers);
        answers.send(Ok(answer(1))).await.unwrap();
        let first = next_frame(&mut body).await.unwrap().into_data().unwrap();
        let (first_at, first_len) = (first.as_ptr() as usize, first.len());
        drop(first);
        answers.send(Ok(answer(2))).await.unwrap();
        let second = next_frame(&mut body).await.unwrap().into_data().unwrap();
        // Taken back to its start, or (had the first allocation left room)
        // written on after the first frame: the same buffer either way.
        let second_at = second.as_ptr() as usize;
        assert!(
            second_at == first_at || second_at == first_at + first_len,
            "written into the same buffer"
        );
        assert_eq!(answers_in(second), vec![answer(2)]);
    }

    #[test]
    fn a_status_becomes_the_trailers_that_end_the_stream() {
        let status = Status::cancelled("the session sent nothing");
        let trailers = trailers_of(status);
        let read_back = Status::from_header_map(&trailers).expect("a status");
        assert_eq!(read_back.code(), Code::Cancelled);
        assert_eq!(read_back.message(), "the session sent nothing");
        assert!(trailers.get(CONTENT_TYPE).is_none());
        let ok = Status::from_header_map(&trailers_of(Status::ok(""))).expect("a status");
        assert_eq!(ok.code(), Code::Ok);
    }
}
