//! [`Bell`] and [`Ringer`]: a doorbell between the two processes of a region,
//! a non-blocking pipe whose read end the waiting side sleeps on and whose
//! write end the other side rings. Each side holds only the ends it needs.
//!
//! A session whose worker and server are tasks of one runtime (`ps-local`)
//! rings in-process doorbells instead ([`in_process_doorbell`]): a ring
//! wakes the sleeping task itself, with no pipe and no turn through the
//! runtime's I/O driver, and a dropped [`Ringer`] hangs up as a closed pipe
//! does.
//!
//! A ring's reader or writer rings only after finding the other side's
//! "waiting" word set (`ring.rs`), so an operation between two busy processes
//! makes no system call; a spurious wake is harmless, because every waiter
//! checks again what it waits for.

use std::future::poll_fn;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::Poll;

use futures::task::AtomicWaker;
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

/// A new doorbell between two tasks of this process: `(the end one sleeps
/// on, the end the other rings)`. Ringing wakes the sleeping task directly,
/// with no pipe and no pass through the runtime's I/O driver (the runtime
/// still wakes a parked thread of its own to run it, when it has to).
pub fn in_process_doorbell() -> (Bell, Ringer) {
    let shared = Arc::new(InProcess::default());
    (
        Bell::InProcess(Arc::clone(&shared)),
        Ringer::InProcess(shared),
    )
}

/// What both ends of an in-process doorbell share.
#[derive(Debug, Default)]
pub struct InProcess {
    /// The sleeping task, once it has slept.
    waker: AtomicWaker,
    /// [`RUNG`] since the sleeper last woke, and [`HUNG_UP`]: one word, so
    /// that a wait sees a ring and the hang-up after it together.
    state: AtomicU8,
}

/// Rung since the sleeper last woke.
const RUNG: u8 = 1;

/// The ringing end was dropped, as a pipe's write end closes.
const HUNG_UP: u8 = 2;

/// The end of a doorbell this side sleeps on.
#[derive(Debug)]
pub enum Bell {
    /// A pipe's read end, registered with a runtime.
    Pipe(pipe::Receiver),
    /// An in-process doorbell's sleeping end.
    InProcess(Arc<InProcess>),
}

impl Bell {
    /// The doorbell whose read end is `fd`, registered with the current tokio
    /// runtime.
    ///
    /// # Errors
    /// `fd` is not a pipe, or cannot be registered.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self::Pipe(pipe::Receiver::from_owned_fd(fd)?))
    }

    /// Waits until the bell has been rung since the last wait returned.
    ///
    /// # Errors
    /// The pipe failed, or its other end closed.
    pub async fn wait(&self) -> io::Result<()> {
        match self {
            Self::Pipe(pipe) => wait_on_pipe(pipe).await,
            Self::InProcess(bell) => wait_in_process(bell).await,
        }
    }

    /// Whether the ringing end is gone (an in-process doorbell's only: a
    /// pipe's shows when it is waited on).
    pub fn hung_up(&self) -> bool {
        matches!(self, Self::InProcess(bell) if bell.state.load(Ordering::Acquire) & HUNG_UP != 0)
    }

    /// Whether this is an in-process doorbell.
    pub fn is_in_process(&self) -> bool {
        matches!(self, Self::InProcess(_))
    }
}

async fn wait_on_pipe(pipe: &pipe::Receiver) -> io::Result<()> {
    let mut rings = [0u8; 64];
    loop {
        pipe.readable().await?;
        match pipe.try_read(&mut rings) {
            Ok(0) => return Err(closed_by_the_other_side()),
            Ok(_) => return Ok(()),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
    }
}

/// Like a pipe, a ring before the hang-up is still delivered first.
async fn wait_in_process(bell: &InProcess) -> io::Result<()> {
    poll_fn(|cx| {
        // Registered before the check, so a ring after it wakes this task.
        bell.waker.register(cx.waker());
        let seen = bell.state.fetch_and(!RUNG, Ordering::AcqRel);
        if seen & RUNG != 0 {
            Poll::Ready(Ok(()))
        } else if seen & HUNG_UP != 0 {
            Poll::Ready(Err(closed_by_the_other_side()))
        } else {
            Poll::Pending
        }
    })
    .await
}

fn closed_by_the_other_side() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the other side closed its doorbell",
    )
}

/// The end of a doorbell this side rings.
#[derive(Debug)]
pub enum Ringer {
    /// A pipe's write end.
    Pipe(OwnedFd),
    /// An in-process doorbell's ringing end.
    InProcess(Arc<InProcess>),
}

impl Ringer {
    /// The doorbell whose write end is `fd`.
    ///
    /// # Errors
    /// `fd` cannot be made non-blocking.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let flags = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(Self::Pipe(fd))
    }

    /// Rings: wakes the side waiting in [`Bell::wait`], now or at its next wait.
    pub fn ring(&self) {
        match self {
            // A full pipe (`EAGAIN`) has been rung already; a closed one has
            // nobody left to wake.
            Self::Pipe(fd) => drop(rustix::io::write(fd, &[1])),
            Self::InProcess(bell) => {
                bell.state.fetch_or(RUNG, Ordering::Release);
                bell.waker.wake();
            }
        }
    }
}

impl Drop for Ringer {
    fn drop(&mut self) {
        if let Self::InProcess(bell) = self {
            bell.state.fetch_or(HUNG_UP, Ordering::Release);
            bell.waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ring_before_the_wait_is_not_lost() {
        let (read, write) = doorbell().unwrap();
        let (bell, ringer) = (Bell::new(read).unwrap(), Ringer::new(write).unwrap());
        rung_twice_then_hung_up(bell, ringer).await;
    }

    #[tokio::test]
    async fn an_in_process_ring_before_the_wait_is_not_lost() {
        let (bell, ringer) = in_process_doorbell();
        assert!(!bell.hung_up());
        rung_twice_then_hung_up(bell, ringer).await;
    }

    /// Rings `bell` twice before its wait, which returns once; then hangs up,
    /// and the next wait says so.
    async fn rung_twice_then_hung_up(bell: Bell, ringer: Ringer) {
        ringer.ring();
        ringer.ring();
        tokio::time::timeout(std::time::Duration::from_secs(5), bell.wait())
            .await
            .expect("rung before the wait")
            .unwrap();
        drop(ringer);
        let closed = within(bell.wait()).await.unwrap_err();
        assert_eq!(closed.kind(), io::ErrorKind::BrokenPipe);
    }

    async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(5), future)
            .await
            .expect("the bell answered in time")
    }

    /// A task asleep on an in-process bell wakes when it is rung; one rung
    /// and then hung up gets the ring first, as from a pipe.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_in_process_ring_wakes_the_sleeping_task_and_comes_before_the_hang_up() {
        let (bell, ringer) = in_process_doorbell();
        let (asleep, wake) = tokio::sync::oneshot::channel();
        let sleeper = tokio::spawn(async move {
            {
                let mut first = std::pin::pin!(bell.wait());
                assert!(futures::poll!(first.as_mut()).is_pending(), "not rung yet");
                let _ = asleep.send(());
                first.await.unwrap();
            }
            bell
        });
        wake.await.unwrap();
        ringer.ring();
        let bell = tokio::time::timeout(std::time::Duration::from_secs(5), sleeper)
            .await
            .expect("the ring woke the sleeper")
            .unwrap();
        ringer.ring();
        drop(ringer);
        assert!(bell.hung_up());
        within(bell.wait())
            .await
            .expect("the ring before the hang-up");
        let closed = within(bell.wait()).await.unwrap_err();
        assert_eq!(closed.kind(), io::ErrorKind::BrokenPipe);
    }
}
