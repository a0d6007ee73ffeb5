//! [`Bell`] and [`Ringer`]: a doorbell between the two processes of a region,
//! a non-blocking pipe whose read end the waiting side sleeps on and whose
//! write end the other side rings. Each side holds only the ends it needs.
//!
//! A ring's reader or writer rings only after finding the other side's
//! "waiting" word set (`ring.rs`), so an operation between two busy processes
//! makes no system call; a spurious wake is harmless, because every waiter
//! checks again what it waits for.

use std::io;
use std::os::fd::OwnedFd;

use rustix::pipe::PipeFlags;
use tokio::net::unix::pipe;

/// A new doorbell: `(read end, write end)`, both non-blocking.
///
/// # Errors
/// The system refused a pipe.
pub fn doorbell() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(
        PipeFlags::CLOEXEC | PipeFlags::NONBLOCK,
    )?)
}

/// The end of a doorbell this side sleeps on.
#[derive(Debug)]
pub struct Bell {
    pipe: pipe::Receiver,
}

impl Bell {
    /// The doorbell whose read end is `fd`, registered with the current tokio
    /// runtime.
    ///
    /// # Errors
    /// `fd` is not a pipe, or cannot be registered.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            pipe: pipe::Receiver::from_owned_fd(fd)?,
        })
    }

    /// Waits until the bell has been rung since the last wait returned.
    ///
    /// # Errors
    /// The pipe failed, or its other end closed.
    pub async fn wait(&self) -> io::Result<()> {
        let mut rings = [0u8; 64];
        loop {
            self.pipe.readable().await?;
            match self.pipe.try_read(&mut rings) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the other side closed its doorbell",
                    ));
                }
                Ok(_) => return Ok(()),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error),
            }
        }
    }
}

/// The end of a doorbell this side rings.
#[derive(Debug)]
pub struct Ringer {
    fd: OwnedFd,
}

impl Ringer {
    /// The doorbell whose write end is `fd`.
    ///
    /// # Errors
    /// `fd` cannot be made non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let flags = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(Self { fd })
    }

    /// Rings: wakes the side waiting in [`Bell::wait`], now or at its next wait.
    pub fn ring(&self) {
        // A full pipe (`EAGAIN`) has been rung already; a closed one has
        // nobody left to wake.
        let _ = rustix::io::write(&self.fd, &[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ring_before_the_wait_is_not_lost() {
        let (read, write) = doorbell().unwrap();
        let (bell, ringer) = (Bell::new(read).unwrap(), Ringer::new(write).unwrap());
        ringer.ring();
        ringer.ring();
        tokio::time::timeout(std::time::Duration::from_secs(5), bell.wait())
            .await
            .expect("rung before the wait")
            .unwrap();
        drop(ringer);
        let closed = bell.wait().await.unwrap_err();
        assert_eq!(closed.kind(), io::ErrorKind::BrokenPipe);
    }
}
