//! [`bounded`]: a server's accepted connections, at most `max` open at once.
//!
//! A connection accepted past the limit is closed at once (and said so at
//! WARN), so a client that opens connections without end cannot exhaust the
//! server's sockets or memory; an open connection gives its place back when it
//! closes. HTTP/2 keep-alive pings (see `TransportConfig`) close peers that stop
//! answering, so dead connections do not hold places for long.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

/// An accepted connection holding one place under the limit until it closes.
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    _place: OwnedSemaphorePermit,
}

/// `incoming`, passing at most `max` connections open at once; `who` names the
/// server in the warning about a refused one.
pub fn bounded<S, IO>(
    incoming: S,
    max: usize,
    who: String,
) -> impl Stream<Item = std::io::Result<Counted<IO>>>
where
    S: Stream<Item = std::io::Result<IO>>,
{
    let places = Arc::new(Semaphore::new(max));
    incoming.filter_map(move |accepted| {
        let io = match accepted {
            Ok(io) => io,
            Err(error) => return Some(Err(error)),
        };
        match Arc::clone(&places).try_acquire_owned() {
            Ok(place) => Some(Ok(Counted { io, _place: place })),
            Err(_) => {
                tracing::warn!(
                    max,
                    "{who} refused a connection: {max} are open (raise --max-connections if the cluster needs more)"
                );
                None
            }
        }
    })
}

impl<IO: Connected> Connected for Counted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
