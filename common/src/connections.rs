//! [`bounded`]: a server's accepted connections, at most `max` open at once,
//! each closed once it has had no request for the idle limit.
//!
//! A connection accepted past the limit is closed at once (and said so at
//! WARN), so a client that opens connections without end cannot exhaust the
//! server's sockets or memory; an open connection gives its place back when it
//! closes. HTTP/2 keep-alive pings (see `TransportConfig`) close peers that stop
//! answering, so dead connections do not hold places for long; the idle limit
//! closes live ones that hold a place without asking anything
//! ([`crate::idle`] counts each connection's requests in flight).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use crate::idle::{Activity, Tracked};

/// An accepted connection holding one place under the limit until it closes.
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    _place: OwnedSemaphorePermit,
    activity: Arc<Activity>,
    idle_limit: Option<Duration>,
    /// When to look at the connection's activity again.
    watchdog: Option<Pin<Box<Sleep>>>,
}

/// `incoming`, passing at most `max` connections open at once, and ending each
/// one that has had no request in flight for `idle_limit` (never when `None`);
/// `who` names the server in the warning about a refused one.
pub fn bounded<S, IO>(
    incoming: S,
    max: usize,
    idle_limit: Option<Duration>,
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
            Ok(place) => Some(Ok(Counted {
                io,
                _place: place,
                activity: Arc::new(Activity::default()),
                idle_limit,
                watchdog: None,
            })),
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
    type ConnectInfo = Tracked<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        Tracked::new(self.io.connect_info(), Arc::clone(&self.activity))
    }
}

impl<IO> Counted<IO> {
    /// Whether the connection has been idle past its limit. Looks at its
    /// activity only when the watchdog fires (first a whole limit after the
    /// connection opened, then when it could next be past it), so a read that
    /// finds nothing costs one timer poll.
    fn idle_past_limit(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.idle_limit else {
            return false;
        };
        let watchdog = self
            .watchdog
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        while watchdog.as_mut().poll(cx).is_ready() {
            // With requests in flight, look again a whole limit later.
            let wait = match self.activity.idle_for() {
                Some(idle) if idle >= limit => return true,
                Some(idle) => limit - idle,
                None => limit,
            };
            watchdog.as_mut().reset(tokio::time::Instant::now() + wait);
        }
        false
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    /// Reads from the connection; when nothing comes and the connection has
    /// been idle past its limit, ends it (the end of its input, after which
    /// HTTP/2 closes it).
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.as_mut().get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending if this.idle_past_limit(cx) => {
                tracing::debug!(limit = ?this.idle_limit, "closing a connection with no request for the idle limit");
                Poll::Ready(Ok(()))
            }
            read => read,
        }
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
