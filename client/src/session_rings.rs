//! Who reads a shared-memory session's answer ring: the request waiting for
//! an answer when it is the only one that waits ([`OwnReading`]), and a task
//! while several wait ([`read_for_others`]).
//!
//! A training loop has one request in flight at a time: it reads its own
//! answer on its own thread, spinning there, and no other thread is woken
//! on the way. With many in flight (a benchmark's window, many keys at
//! once), a request that read the ring would have to hand it to the next
//! when its own answer came, a wake-up for every answer; a task that reads
//! for all of them until none waits hands each answer over and is never
//! handed anything. The request that reads passes the ring to such a task
//! when it leaves others waiting (its answer came, or it was dropped); the
//! task ends when nobody waits, and the next request reads for itself.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use ps_shm::{Answer, AnswerRing};
use tokio::sync::oneshot;
use tonic::Status;

use super::{Waiting, broken, delivered, end, hand_over, lock, taken};

/// Who reads the answer ring now.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reader {
    /// Nobody: the next request to wait reads it.
    #[default]
    Nobody,
    /// A request, for itself (others that wait meanwhile are handed their
    /// answers by it).
    Request,
    /// A task, for every request that waits.
    Task,
}

/// The ring read by the one request waiting: held from before its request
/// goes out until it leaves, when the ring passes to a task if others
/// wait, or to nobody.
pub(super) struct OwnReading<'a> {
    waiting: &'a Arc<Mutex<Waiting>>,
    answers: &'a AnswerRing,
}

impl<'a> OwnReading<'a> {
    /// The ring for this request to read when nobody reads it, else `None`
    /// (the reader hands this request its answer).
    pub(super) fn claim(waiting: &'a Arc<Mutex<Waiting>>, answers: &'a AnswerRing) -> Option<Self> {
        let mut state = lock(waiting);
        if state.reader != Reader::Nobody {
            return None;
        }
        state.reader = Reader::Request;
        Some(Self { waiting, answers })
    }

    /// Waits for `write`, this request's own write, reading meanwhile the
    /// answers that come: none can be this request's (the server has not
    /// read it whole), and they are mostly answers nobody waits for, to
    /// requests given up midway through their writes; any other is handed to
    /// the request it belongs to. A server that holds a session's answers
    /// while they wait for room stops reading its requests once it holds
    /// [`ps_shm::serving::ANSWERS_QUEUED`]; a request larger than the ring's
    /// free space, waiting for room without reading, would then wait for the
    /// server, and the server for it.
    ///
    /// When a read fails, the session has ended, and every request waiting
    /// fails with it, this one included.
    ///
    /// Most writes finish when first polled; only one that waits builds the
    /// reading, on the heap, and the write stays in the caller's future, so
    /// a request's future is no larger for this. (With the reading inline a
    /// call's future grew from 2,024 to 4,512 bytes in a debug build, moved
    /// as requests are queued and joined, and `kv`'s 4 KiB pushes at 1x1 ran
    /// about 4 % slower.)
    pub(super) async fn while_writing<T>(&self, mut write: Pin<&mut impl Future<Output = T>>) -> T {
        if let Poll::Ready(written) = futures::poll!(write.as_mut()) {
            return written;
        }
        Box::pin(self.read_while(write)).await
    }

    /// [`OwnReading::while_writing`] once the write has waited.
    async fn read_while<T>(&self, mut write: Pin<&mut impl Future<Output = T>>) -> T {
        loop {
            let reader = tokio::select! {
                biased;
                written = &mut write => return written,
                reader = self.answers.lock_answered() => reader,
            };
            match reader.next().await {
                Ok((answer, _)) => hand_over(self.waiting, answer),
                Err(error) => {
                    end(self.waiting, broken(&error));
                    return write.await;
                }
            }
        }
    }

    /// Reads answers, handing each to the request it belongs to, until the
    /// one `mine` is the slot of comes (or the session ends).
    pub(super) async fn answer(
        self,
        mut mine: oneshot::Receiver<Result<Answer, Status>>,
    ) -> Result<Answer, Status> {
        loop {
            // Only lent payloads, or the session's end, keep the ring.
            let mut holding = tokio::select! {
                biased;
                answer = &mut mine => return delivered(answer),
                reader = self.answers.lock() => Some(reader),
            };
            while let Some(reader) = holding.take() {
                if let Some(answer) = taken(&mut mine) {
                    return answer;
                }
                let next = tokio::select! {
                    biased;
                    answer = &mut mine => return delivered(answer),
                    next = reader.next() => next,
                };
                match next {
                    Ok((answer, still)) => {
                        hand_over(self.waiting, answer);
                        holding = still;
                    }
                    Err(error) => end(self.waiting, broken(&error)),
                }
            }
            if let Some(answer) = taken(&mut mine) {
                return answer;
            }
        }
    }
}

impl Drop for OwnReading<'_> {
    /// Passes the ring to a task when others wait, else to nobody.
    fn drop(&mut self) {
        let mut state = lock(self.waiting);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No task can read for the others: they fail rather than wait.
            state.reader = Reader::Nobody;
            drop(state);
            let why =
                Status::unavailable("the shared-memory session's reader left with no runtime");
            end(self.waiting, why);
            return;
        };
        if state.answers.is_empty() || state.ended.is_some() {
            state.reader = Reader::Nobody;
            return;
        }
        state.reader = Reader::Task;
        drop(state);
        runtime.spawn(read_for_others(
            Arc::clone(self.waiting),
            self.answers.clone(),
        ));
    }
}

/// Reads answers for the requests waiting, handing each over, until none
/// has waited for [`LINGER`] or the session ends; the next request then
/// reads for itself.
pub(super) async fn read_for_others(waiting: Arc<Mutex<Waiting>>, answers: AnswerRing) {
    while waits_within(&waiting, LINGER).await {
        let mut holding = Some(answers.lock().await);
        while let Some(reader) = holding.take() {
            match reader.next().await {
                Ok((answer, still)) => {
                    hand_over(&waiting, answer);
                    holding = still;
                }
                Err(error) => end(&waiting, broken(&error)),
            }
            if nobody_waits(&waiting) {
                break;
            }
        }
    }
}

/// How long a reading task stays once nobody waits, in case more requests
/// come: requests sent in bursts (a window of them driven from one task,
/// or a step's keys) would otherwise start a task for each burst, a
/// wake-up of another thread every time. A lone request leaves no task, so
/// a training loop's exchanges never meet one.
const LINGER: Duration = ps_shm::ring::SPIN;

/// Whether a request waits now or within `linger` (this task spinning
/// meanwhile); when none does, or the session ended, the ring passes to
/// nobody.
async fn waits_within(waiting: &Mutex<Waiting>, linger: Duration) -> bool {
    let started = Instant::now();
    loop {
        {
            let mut state = lock(waiting);
            if state.ended.is_some() {
                state.reader = Reader::Nobody;
                return false;
            }
            if !state.answers.is_empty() {
                return true;
            }
            if started.elapsed() >= linger {
                state.reader = Reader::Nobody;
                return false;
            }
        }
        tokio::task::yield_now().await;
    }
}

/// Whether nobody waits (or the session ended) now.
fn nobody_waits(waiting: &Mutex<Waiting>) -> bool {
    let state = lock(waiting);
    state.answers.is_empty() || state.ended.is_some()
}
