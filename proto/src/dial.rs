//! Reaching a server by its address: `host:port` (or a URI) over TCP, or
//! `unix:PATH`, a Unix-domain socket on this host that a server also listens
//! on (`ps-server --listen-unix PATH`). Every client of the project dials
//! through [`Dialer`], so each one takes both kinds of address.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::transport::{TransportConfig, http_uri};

/// What an address of a Unix-domain socket starts with.
pub const UNIX_PREFIX: &str = "unix:";

/// The socket path of a `unix:PATH` (or `unix://PATH`) address; `None` for
/// any other address.
pub fn unix_path(addr: &str) -> Option<&str> {
    let rest = addr.strip_prefix(UNIX_PREFIX)?;
    Some(rest.strip_prefix("//").unwrap_or(rest))
}

/// One server's endpoint with the transport's settings, and how to reach it.
#[derive(Debug, Clone)]
pub struct Dialer {
    endpoint: Endpoint,
    socket: Option<PathBuf>,
}

impl Dialer {
    /// The dialer of `addr` with `transport`'s settings.
    ///
    /// # Errors
    /// When `addr` is neither a socket path nor a valid URI.
    pub fn new(transport: &TransportConfig, addr: &str) -> Result<Self, tonic::transport::Error> {
        match unix_path(addr) {
            // The URI only names the HTTP/2 authority; the connector below
            // dials the socket.
            Some(path) => Ok(Self {
                endpoint: transport.endpoint("http://localhost")?,
                socket: Some(PathBuf::from(path)),
            }),
            None => Ok(Self {
                endpoint: transport.endpoint(http_uri(addr))?,
                socket: None,
            }),
        }
    }

    /// A connected channel.
    ///
    /// # Errors
    /// When nothing answers at the address (or TLS fails).
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        let Some(path) = self.socket.clone() else {
            return self.endpoint.connect().await;
        };
        let dial = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        });
        self.endpoint.connect_with_connector(dial).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_are_told_from_tcp_ones() {
        assert_eq!(unix_path("unix:/run/ps.sock"), Some("/run/ps.sock"));
        assert_eq!(unix_path("unix:///run/ps.sock"), Some("/run/ps.sock"));
        assert_eq!(unix_path("unix:ps.sock"), Some("ps.sock"));
        assert_eq!(unix_path("127.0.0.1:7070"), None);
        assert_eq!(unix_path("http://host:7070"), None);
    }

    #[tokio::test]
    async fn nothing_listening_at_a_socket_is_a_connect_error() {
        let dir = std::env::temp_dir().join(format!("ps-dial-{}", std::process::id()));
        let addr = format!("unix:{}/absent.sock", dir.display());
        let dialer = Dialer::new(&TransportConfig::default(), &addr).unwrap();
        assert!(dialer.connect().await.is_err());
    }
}
