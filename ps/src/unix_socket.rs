//! gRPC on a Unix-domain socket beside the TCP listener (`ps-server
//! --listen-unix PATH`): the same services behind the same token and roles,
//! for a worker on this host that reaches the server at `unix:PATH` instead
//! of paying for loopback TCP (where shared memory is off or cannot work).
//!
//! The socket file is made readable and writable by this user alone; a stale
//! one (a socket nobody answers on, left by a server that was killed) is
//! replaced, anything else at the path is refused; and the file is removed
//! when serving ends.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// A bound socket and the guard that removes its file.
pub(crate) struct UnixSocket {
    /// The listener.
    pub listener: UnixListener,
    /// Removes the file when dropped (serving ended, or its task was aborted).
    pub file: SocketFile,
}

/// A socket file, removed when this is dropped.
pub(crate) struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds a socket at `path`, mode 0600.
///
/// # Errors
/// Something other than a socket is at `path`, a server answers on it, or
/// the socket cannot be made there; each message names the path.
pub(crate) fn bind(path: &Path) -> io::Result<UnixSocket> {
    let shown = path.display();
    if let Ok(found) = std::fs::symlink_metadata(path) {
        if !found.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "--listen-unix {shown}: the path exists and is not a socket; give another path"
                ),
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("--listen-unix {shown}: a server already listens on it"),
            ));
        }
        std::fs::remove_file(path)?;
        tracing::info!(path = %shown, "replaced a stale socket nobody answered on");
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| io::Error::new(e.kind(), format!("--listen-unix {shown}: {e}")))?;
    let file = SocketFile(path.to_path_buf());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(UnixSocket { listener, file })
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
        // A listener that is gone leaves a file nobody answers on.
        drop(socket.listener);
        std::mem::forget(socket.file);
        assert!(path.exists());
        let again = bind(&path).unwrap();
        drop(again);
        assert!(!path.exists(), "removed with its guard");
        std::fs::write(&path, b"not a socket").unwrap();
        let refused = bind(&path).err().unwrap().to_string();
        assert!(refused.contains("not a socket"), "{refused}");
    }
}
