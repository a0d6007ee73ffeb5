//! Prometheus metrics: the exposition endpoint every program serves on
//! `--metrics-listen` ([`serve`]), and the build information every program
//! reports ([`register_build_info`]).
//!
//! Metrics are kept with `prometheus-client` and written in the OpenMetrics
//! text format to scrapers that ask for it (Prometheus does), and in the
//! classic text format to any other ([`crate::text_format`]: `curl`,
//! `promtool check metrics`). Names follow Prometheus's conventions: a
//! `candle_ps_` prefix, base units, `_total` counters, `_seconds` histograms.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};
use tokio::net::TcpListener;

use crate::text_format::{TEXT_FORMAT, accepts_openmetrics, to_text_format};

/// The content type of OpenMetrics text.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path metrics are served at.
pub const METRICS_PATH: &str = "/metrics";

/// Registers `candle_ps_build_info{version, commit, program}`: the release and
/// the git commit (stamped by `build.rs` from `git rev-parse`, or taken from
/// `PS_GIT_COMMIT` at build time; `unknown` outside a git checkout).
pub fn register_build_info(registry: &mut Registry, program: &str) {
    let commit = option_env!("PS_GIT_COMMIT").unwrap_or("unknown");
    let info = Info::new(vec![
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        ("commit", commit.to_string()),
        ("program", program.to_string()),
    ]);
    registry.register(
        "candle_ps_build",
        "The program, its release and the git commit it was built from",
        info,
    );
}

/// A gauge registered under `name`.
pub fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    registered(registry, name, help, Gauge::default())
}

/// `metric`, registered under `name` (the registry keeps a clone, which shares
/// its value).
pub fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// What a scrape reads: the registry, and a function run first to bring the
/// gauges read from elsewhere (a store's size, say) up to date.
pub struct Exposition {
    registry: Registry,
    refresh: Box<dyn Fn() + Send + Sync>,
}

impl Exposition {
    /// `registry`, with `refresh` run before each scrape.
    pub fn new(registry: Registry, refresh: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            registry,
            refresh: Box::new(refresh),
        }
    }

    /// The metrics as OpenMetrics text, refreshed now.
    pub fn text(&self) -> String {
        (self.refresh)();
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

/// The listener for `--metrics-listen ADDR`, bound now; none without one.
///
/// # Errors
/// When `addr` cannot be listened on; the message names it.
pub async fn bind(addr: Option<&str>) -> std::io::Result<Option<TcpListener>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    TcpListener::bind(addr).await.map(Some).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen for metrics on {addr}: {e}"),
        )
    })
}

/// `GET path` from `addr` over HTTP/1.0 (so the answer comes whole, never
/// chunked, ended by the close): the status line and the body. What scrapes a
/// metrics endpoint (`ps-microbench ps-throughput --metrics on`, the tests).
///
/// # Errors
/// When the connection fails or the answer is not HTTP.
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(String, String)> {
    http_get_accepting(addr, path, "*/*").await
}

/// [`http_get`] with the `Accept` header `accept`.
///
/// # Errors
/// As [`http_get`].
pub async fn http_get_accepting(
    addr: &str,
    path: &str,
    accept: &str,
) -> std::io::Result<(String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not an HTTP answer from {addr}: {response:?}"),
        )
    })?;
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, body.to_string()))
}

/// Serves `GET /metrics` on `listener` (HTTP/1.1) until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    exposition: Arc<Exposition>,
    shutdown: impl Future<Output = ()>,
) {
    let addr = listener.local_addr().ok();
    tracing::info!(?addr, path = METRICS_PATH, "metrics listening");
    let accepting = async {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let exposition = Arc::clone(&exposition);
            tokio::spawn(async move {
                let answer = hyper::service::service_fn(move |request| {
                    let exposition = Arc::clone(&exposition);
                    async move { Ok::<_, Infallible>(respond(&exposition, &request)) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), answer);
                if let Err(error) = connection.await {
                    tracing::debug!(%error, "a metrics connection ended with an error");
                }
            });
        }
    };
    tokio::select! {
        () = accepting => {}
        () = shutdown => {}
    }
}

fn respond(exposition: &Exposition, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status, content_type: &str, body: String| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("a response from fixed parts")
    };
    if request.method() != Method::GET || request.uri().path() != METRICS_PATH {
        let body = format!("metrics are at GET {METRICS_PATH}\n");
        return reply(StatusCode::NOT_FOUND, "text/plain", body);
    }
    let accept = request
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    match accepts_openmetrics(accept) {
        true => reply(StatusCode::OK, CONTENT_TYPE, exposition.text()),
        false => reply(
            StatusCode::OK,
            TEXT_FORMAT,
            to_text_format(&exposition.text()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_and_refreshed_gauges_are_exposed() {
        let mut registry = Registry::default();
        register_build_info(&mut registry, "ps-test");
        let held = gauge(&mut registry, "candle_ps_test_bytes", "Bytes held");
        let source = Arc::new(std::sync::atomic::AtomicI64::new(42));
        let read = Arc::clone(&source);
        let exposition = Exposition::new(registry, move || {
            held.set(read.load(std::sync::atomic::Ordering::Relaxed));
        });
        let text = exposition.text();
        assert!(text.contains("candle_ps_test_bytes 42"), "{text}");
        assert!(text.contains("candle_ps_build_info{"), "{text}");
        assert!(text.contains("program=\"ps-test\""), "{text}");
        let commit = option_env!("PS_GIT_COMMIT").unwrap_or("unknown");
        assert!(text.contains(&format!("commit=\"{commit}\"")), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        source.store(7, std::sync::atomic::Ordering::Relaxed);
        assert!(exposition.text().contains("candle_ps_test_bytes 7"));
    }
}
