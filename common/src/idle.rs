//! Requests in flight per connection, so that a server can close connections
//! that hold a place without asking anything ([`crate::connections::bounded`]).
//!
//! Each accepted connection has an [`Activity`], which reaches the requests on
//! it through their connection information ([`Tracked`]). The
//! [`TrackRequestsLayer`] counts a request as in flight from its arrival until
//! its answer's body is dropped, so a streamed answer, or a pull held for a
//! BSP step, keeps its connection busy however long it takes.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body, Frame, SizeHint};
use hyper::{Request, Response};
use tonic::transport::server::TlsConnectInfo;

/// One connection's requests in flight, and since when it has had none.
#[derive(Debug)]
pub struct Activity {
    in_flight: AtomicUsize,
    /// When the connection opened.
    opened: Instant,
    /// When its last request ended, in nanoseconds after `opened`.
    idle_since_ns: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            opened: Instant::now(),
            idle_since_ns: AtomicU64::new(0),
        }
    }
}

impl Activity {
    /// How long the connection has had no request in flight; `None` while it has.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_nanos(self.idle_since_ns.load(Ordering::Acquire));
        Some(self.opened.elapsed().saturating_sub(since))
    }

    /// Counts a request in flight until the returned guard is dropped.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // The idle time starts before the count says idle, so a watchdog that
        // sees no request never reads an older start.
        let now = u64::try_from(self.0.opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.idle_since_ns.fetch_max(now, Ordering::AcqRel);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's information as the transport gives it, with its activity.
#[derive(Debug, Clone)]
pub struct Tracked<I> {
    /// What the transport says of the connection (its addresses).
    pub inner: I,
    activity: Arc<Activity>,
}

impl<I> Tracked<I> {
    /// `inner`, counting requests in `activity`.
    pub fn new(inner: I, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

/// The activity of the connection `request` came on, over plain TCP or a
/// Unix-domain socket, or TLS over either.
fn activity_of<B>(request: &Request<B>) -> Option<&Arc<Activity>> {
    let extensions = request.extensions();
    activity::<tonic::transport::server::TcpConnectInfo>(extensions)
        .or_else(|| activity::<tonic::transport::server::UdsConnectInfo>(extensions))
}

/// The activity in the connection information of kind `I` among
/// `extensions`, plain or under TLS.
fn activity<I: Send + Sync + 'static>(extensions: &http::Extensions) -> Option<&Arc<Activity>> {
    extensions
        .get::<Tracked<I>>()
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<Tracked<I>>>()
                .map(|tls| tls.get_ref())
        })
        .map(|tracked| &tracked.activity)
}

/// Counts every request as in flight on its connection until its answer's
/// body is dropped (`Server::layer`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackRequestsLayer;

impl<S> tower::Layer<S> for TrackRequestsLayer {
    type Service = TrackRequests<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TrackRequests { inner }
    }
}

/// The service [`TrackRequestsLayer`] makes.
#[derive(Debug, Clone)]
pub struct TrackRequests<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for TrackRequests<S>
where
    S: tower::Service<Request<B>, Response = Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let in_flight = activity_of(&request).map(Activity::begin);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(match in_flight {
                Some(in_flight) => response.map(|body| {
                    tonic::body::Body::new(HeldBody {
                        body,
                        _in_flight: in_flight,
                    })
                }),
                None => response,
            })
        })
    }
}

/// An answer's body that keeps its request in flight until it is dropped.
struct HeldBody {
    body: tonic::body::Body,
    _in_flight: InFlight,
}

impl Body for HeldBody {
    type Data = <tonic::body::Body as Body>::Data;
    type Error = <tonic::body::Body as Body>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_idle_only_with_no_request_in_flight() {
        let activity = Arc::new(Activity::default());
        assert!(activity.idle_for().is_some());
        let first = activity.begin();
        let second = activity.begin();
        assert_eq!(activity.idle_for(), None);
        drop(first);
        assert_eq!(activity.idle_for(), None, "one is still in flight");
        drop(second);
        let idle = activity.idle_for().expect("idle again");
        assert!(
            idle < Duration::from_secs(5),
            "counted from the last end: {idle:?}"
        );
    }
}
