//! Reaching a server by its address: `host:port` (or a URI) over TCP, or
//! `unix:PATH`, a Unix-domain socket on this host that a server also listens
//! on (`ps-server --listen-unix PATH`). A worker's channels to its servers,
//! the rendezvous wait and `ps-server health` dial through [`Dialer`], so a
//! user may give either kind of address wherever a worker takes `--server`.
//! (With `--scheduler`, the servers' addresses come from the shard map,
//! which holds their TCP addresses.)

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

/// Bytes each way a Unix-domain socket of this project buffers. The kernel's
/// default (`net.core.wmem_default`, 208 KiB here) made a 1 MiB message
/// take several wake-ups where loopback TCP, which tunes its buffers up to
/// a few MiB, takes one; the kernel caps what is asked at
/// `net.core.wmem_max` and `rmem_max`.
pub const UNIX_SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Widens `stream`'s buffers both ways to [`UNIX_SOCKET_BUFFER_BYTES`] (or
/// the kernel's cap); a socket that refuses keeps its own.
pub fn widen_buffers(stream: &tokio::net::UnixStream) {
    let _ = rustix::net::sockopt::set_socket_send_buffer_size(stream, UNIX_SOCKET_BUFFER_BYTES);
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(stream, UNIX_SOCKET_BUFFER_BYTES);
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
            // The connector below dials the socket; the URI gives the HTTP/2
            // authority, and its scheme turns `https` under TLS, which is
            // what makes tonic run TLS over the socket (checking the
            // transport's server name, as over TCP).
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
    /// When nothing answers at the address, or the TLS handshake fails.
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        let Some(path) = self.socket.clone() else {
            return self.endpoint.connect().await;
        };
        let dial = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                widen_buffers(&stream);
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
    async fn a_socket_address_dials_that_socket() {
        let dir = std::env::temp_dir().join(format!("ps-dial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ps.sock");
        let _ = std::fs::remove_file(&path);
        let absent = Dialer::new(
            &TransportConfig::default(),
            &format!("unix:{}", path.display()),
        );
        let error = absent.unwrap().connect().await.unwrap_err();
        let chain = std::error::Error::source(&error).map(ToString::to_string);
        assert!(
            chain.is_some_and(|reason| reason.contains("No such file")),
            "{error:?}"
        );
        // Something listening there is reached: the HTTP/2 handshake starts
        // on the socket, not on a TCP port.
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let accepted = tokio::spawn(async move { listener.accept().await.is_ok() });
        let dialer = Dialer::new(
            &TransportConfig::default(),
            &format!("unix:{}", path.display()),
        );
        let dialing = tokio::spawn(async move { dialer.unwrap().connect().await });
        assert!(accepted.await.unwrap(), "the socket took the connection");
        dialing.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
