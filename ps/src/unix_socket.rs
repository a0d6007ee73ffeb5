//! gRPC on a Unix-domain socket beside the TCP listener (`ps-server
//! --listen-unix PATH`): the same services behind the same token and roles,
//! the same connection limit and idle timeout, for a worker on this host
//! that reaches the server at `unix:PATH` instead of paying for loopback TCP
//! (where shared memory is off or cannot work).
//!
//! The socket file is made readable and writable by this user alone; a stale
//! one (a socket that refuses connections: its server is gone) is replaced,
//! anything else at the path is refused; and the file is removed when
//! serving ends, at the same grace period as the TCP listener's.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{Stream, StreamExt};
use ps_common::connections::{Counted, bounded};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

/// A bound socket, and the guard that removes its file.
pub(crate) struct UnixSocket {
    listener: UnixListener,
    file: SocketFile,
}

/// A socket file, removed when this is dropped.
pub(crate) struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl UnixSocket {
    /// Where the socket is.
    pub(crate) fn path(&self) -> &Path {
        &self.file.0
    }

    /// Its connections, at most `max` open at once and each closed after
    /// `idle_limit` without a request (as the TCP listener's are), and the
    /// guard of its file.
    pub(crate) fn incoming(
        self,
        max: usize,
        idle_limit: Option<Duration>,
    ) -> (
        impl Stream<Item = io::Result<Counted<UnixStream>>>,
        SocketFile,
    ) {
        let who = format!("ps-server at unix:{}", self.file.0.display());
        let accepted = UnixListenerStream::new(self.listener)
            .inspect(|stream| stream.iter().for_each(ps_proto::dial::widen_buffers));
        let incoming = bounded(accepted, max, idle_limit, who);
        (incoming, self.file)
    }
}

/// The error of `--listen-unix PATH` for `path`: `what` went wrong.
fn named(path: &Path, kind: io::ErrorKind, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(kind, format!("--listen-unix {}: {what}", path.display()))
}

/// Binds a socket at `path`, mode 0600, replacing a stale one.
///
/// # Errors
/// Something other than a socket is at `path`, a server answers on it (or
/// whether one does cannot be told), or the socket cannot be made there;
/// each message names the path.
pub(crate) fn bind(path: &Path) -> io::Result<UnixSocket> {
    if let Ok(found) = std::fs::symlink_metadata(path) {
        if !found.file_type().is_socket() {
            return Err(named(
                path,
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket; give another path",
            ));
        }
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(named(
                    path,
                    io::ErrorKind::AddrInUse,
                    "a server already listens on it; stop it or give another path",
                ));
            }
            // Nobody listens: the socket a killed server left.
            Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)
                    .map_err(|e| named(path, e.kind(), format!("removing a stale socket: {e}")))?;
                tracing::info!(path = %path.display(), "replaced a stale socket nobody answered on");
            }
            Err(error) => {
                return Err(named(
                    path,
                    error.kind(),
                    format!("a socket is there and cannot be checked ({error}); give another path"),
                ));
            }
        }
    }
    let listener = UnixListener::bind(path).map_err(|e| named(path, e.kind(), e))?;
    let file = SocketFile(path.to_path_buf());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| named(path, e.kind(), format!("making it private: {e}")))?;
    Ok(UnixSocket { listener, file })
}

/// Runs `serving` (the socket's gRPC server, which stops taking connections
/// once `begun` is cancelled) until it ends, or until `grace` has passed
/// since `begun` was cancelled; then removes the socket `file`.
///
/// # Errors
/// The server's.
pub(crate) async fn serve(
    serving: impl Future<Output = Result<(), tonic::transport::Error>>,
    file: SocketFile,
    (begun, grace): (CancellationToken, Duration),
) -> Result<(), tonic::transport::Error> {
    let grace_expired = async {
        begun.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    let served = tokio::select! {
        served = serving => served,
        () = grace_expired => {
            tracing::warn!(?grace, "connections on the Unix-domain socket still open after the shutdown grace period; closing them");
            Ok(())
        }
    };
    drop(file);
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_is_private_replaces_a_stale_one_and_is_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ps.sock");
        let socket = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let live = bind(&path).err().unwrap();
        assert_eq!(live.kind(), io::ErrorKind::AddrInUse);
        assert!(
            live.to_string().contains(&path.display().to_string()),
            "{live}"
        );
        // A listener that is gone leaves a file nobody answers on.
        let UnixSocket { listener, file } = socket;
        drop(listener);
        std::mem::forget(file);
        assert!(path.exists());
        let again = bind(&path).unwrap();
        drop(again);
        assert!(!path.exists(), "removed with its guard");
        std::fs::write(&path, b"not a socket").unwrap();
        let refused = bind(&path).err().unwrap().to_string();
        assert!(refused.contains("not a socket"), "{refused}");
    }

    #[tokio::test]
    async fn serving_past_the_grace_period_is_cut_and_the_file_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ps.sock");
        let socket = bind(&path).unwrap();
        let begun = CancellationToken::new();
        begun.cancel();
        // A server that never ends by itself (a connection left open).
        let never = std::future::pending::<Result<(), tonic::transport::Error>>();
        let (_incoming, file) = socket.incoming(4, None);
        serve(never, file, (begun, Duration::from_millis(10)))
            .await
            .unwrap();
        assert!(!path.exists());
    }
}
