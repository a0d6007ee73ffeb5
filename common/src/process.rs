//! What every candle-ps server does the same way: logging set-up, the shutdown
//! signal (SIGTERM or Ctrl-C), and the error a server's `run` fails with.

use ps_proto::transport::TransportConfig;

/// Sets up `tracing` to stderr, filtered by `RUST_LOG` (default `info`), with colours
/// only on a terminal (container logs stay plain text).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second call (two binaries' code in one test process) keeps the first set-up.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Says at WARN level when `who` serves plain TCP on `addr` other than loopback,
/// where anyone who can reach it can read its traffic and send it requests.
pub fn warn_if_plain(who: &str, addr: std::net::SocketAddr, transport: &TransportConfig) {
    if !transport.is_tls() && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "{who} serves plain TCP on an address other than loopback: its traffic is unencrypted; give it --tls-ca, --tls-cert and --tls-key (see `ps-scheduler certs`)"
        );
    }
}

/// Resolves on the first SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("received Ctrl-C"),
        () = terminate => tracing::info!("received SIGTERM"),
    }
}

/// Why a server (`ps-server`, `ps-scheduler`) could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The listener could not be used.
    #[error("listener: {0}")]
    Listener(#[from] std::io::Error),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] ps_proto::tls::TlsError),
}
