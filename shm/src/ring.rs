//! [`RingWriter`] and [`RingReader`]: the two ends of one single-producer,
//! single-consumer ring of words in a [`Region`], a pipe in shared memory.
//!
//! A region holds two rings: requests (the worker writes, the server reads)
//! and answers (the other way). Each ring has four control words, each on its
//! own cache line: `tail` (words ever written; only the writer stores it),
//! `head` (words ever read; only the reader stores it), and the reader's and
//! the writer's "waiting" words. Positions only grow; a word's place in the
//! ring is its position modulo the capacity.
//!
//! The writer copies words in and then publishes the new `tail` (release); the
//! reader loads `tail` (acquire), copies words out and publishes the new
//! `head`. Large writes are published every [`PUBLISH_WORDS`], so the reader
//! copies out while the writer still copies in (a worker reads an answer
//! below 256 KiB only once it is whole, so that reading it never waits:
//! `crate::caller`). A side with nothing to do
//! spins for [`SPIN`] (only when its last wait was short: a peer that
//! computes long between operations would only lose its core to the spinning;
//! and yielding its core to the system at each turn only after the first
//! few microseconds, or after longer when its peer's tasks run on the same
//! runtime, where each turn also goes straight behind those tasks), then
//! sets its waiting word, checks once more, and sleeps on its [`Bell`]; the
//! other side rings that bell only when it finds the waiting word set, so
//! two busy processes exchange words with no system call.
//!
//! The other process is not trusted: a `tail` or `head` that could not come
//! from a well-behaved peer is [`RingError::Corrupt`], and the session ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::bell::{Bell, Ringer};
use crate::copy::Mark;
use crate::region::Region;
use crate::stores::{Kind, Stores};

/// How long a side with nothing to do polls before it sleeps on its bell:
/// longer than a small model's compute between two exchanges (about 65 µs
/// on digits), so that neither side sleeps through it. At 50 µs each
/// exchange paid two wake-ups, and one worker's `data_parallel` took
/// 0.33-0.44 s against 0.19-0.30 s now (docs/benchmarks.md, "A longer spin
/// for the pause between steps").
pub const SPIN: Duration = Duration::from_micros(200);

/// How long a spinning side lets only its own runtime's tasks run before it
/// also gives its core to the system at each turn. An operation passes
/// through several tasks on each side, and a system yield at each of their
/// turns handed the core to another process: with 2 servers and 2 workers
/// on 2 cores, 4 KiB pushes took 27-29.5 µs p50 yielding at once, against
/// 15-16 µs (pulls 18-19) from 5 µs on (docs/benchmarks.md, "The rings'
/// round trip, and when a spinning side gives its core away").
const YIELD_CORE_AFTER: Duration = Duration::from_micros(5);

/// [`YIELD_CORE_AFTER`] for a wait polled by a task of the runtime its peer's
/// tasks run on (`ps-local`'s servers and workers): its turns among the
/// peer's tasks let the peer run when it is queued on this thread, and the
/// system's yield, where the runtime's threads are the only busy ones, hands
/// the core to nothing: 10 % of `ps-local`'s samples were under it, and without it
/// `ps-local` ran about 4 % faster (docs/benchmarks.md, "Ring waits on one
/// runtime"). It still comes after this long, for a peer's runtime thread
/// that other busy threads keep off a core.
const YIELD_CORE_AFTER_PEER_HERE: Duration = Duration::from_micros(50);

/// A wait this short makes the next one spin first. It is well over [`SPIN`]
/// because a wait that slept also counts the other side's own waking: two
/// sides that both slept would otherwise never spin again.
const SHORT_WAIT: Duration = Duration::from_micros(800);

/// How many words a writer copies before publishing them to the reader.
pub const PUBLISH_WORDS: u64 = 8 * 1024;

/// Words at the start of a region, before the rings' data.
pub(crate) const HEADER_WORDS: usize = 128;

/// The header word, on a cache line of its own, where the worker says up
/// to which answer (by sequence number) it is done with the payloads that
/// lay in the server's values arena ([`Released`]).
pub(crate) const RELEASED_WORD: usize = 72;

/// A word of the region header: the layout's version, checked by the worker.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"cps-shm1");

/// Why a ring cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The other side wrote a control word no well-behaved peer writes.
    #[error("the shared-memory ring is corrupt: {0}")]
    Corrupt(String),
    /// Waiting on a doorbell failed.
    #[error("the shared-memory doorbell failed: {0}")]
    Bell(#[from] std::io::Error),
}

/// Which of a region's two rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Worker to server.
    Requests,
    /// Server to worker.
    Answers,
}

/// Where one ring's words are in its region.
#[derive(Debug, Clone, Copy)]
struct Layout {
    tail: usize,
    head: usize,
    reader_waiting: usize,
    writer_waiting: usize,
    data: usize,
    capacity: u64,
}

impl Layout {
    fn of(direction: Direction, capacity_words: usize) -> Self {
        let (control, data) = match direction {
            Direction::Requests => (8, HEADER_WORDS),
            Direction::Answers => (40, HEADER_WORDS + capacity_words),
        };
        Self {
            tail: control,
            head: control + 8,
            reader_waiting: control + 16,
            writer_waiting: control + 24,
            data,
            capacity: capacity_words as u64,
        }
    }

    /// The region's size for two rings of `capacity_words` each.
    fn region_words(capacity_words: usize) -> usize {
        HEADER_WORDS + 2 * capacity_words
    }
}

/// The size in bytes of a region holding two rings of `ring_bytes` each.
pub fn region_bytes(ring_bytes: u64) -> u64 {
    8 * Layout::region_words((ring_bytes / 8) as usize) as u64
}

/// Writes the header of a new region with rings of `ring_bytes`.
pub(crate) fn write_header(region: &Region, ring_bytes: u64) {
    region.words()[0].store(MAGIC, Ordering::Relaxed);
    region.words()[1].store(ring_bytes / 8, Ordering::Release);
}

/// The capacity in words of each ring of `region`, as its header says,
/// checked against the capacity announced (`ring_bytes`) and the region's size.
pub(crate) fn read_header(region: &Region, ring_bytes: u64) -> Result<usize, RingError> {
    let words = region.words();
    if words.len() < HEADER_WORDS || words[0].load(Ordering::Acquire) != MAGIC {
        return Err(RingError::Corrupt(
            "the region does not start with this version's header".to_string(),
        ));
    }
    let capacity = words[1].load(Ordering::Acquire);
    let fits = usize::try_from(capacity).ok().filter(|&c| {
        c > 0
            && capacity == ring_bytes / 8
            && c.checked_mul(2)
                .and_then(|both| both.checked_add(HEADER_WORDS))
                == Some(words.len())
    });
    fits.ok_or_else(|| {
        RingError::Corrupt(format!(
            "rings of {capacity} words do not fill a region of {} words",
            words.len()
        ))
    })
}

/// The region's word saying up to which answer the worker is done reading
/// payloads in the values arena: stored by the worker after its copies
/// (release), loaded by the server before it lets those payloads go
/// (acquire). A worker that stores a wrong number can only make its own
/// pulls read values that changed under them.
#[derive(Debug, Clone)]
pub(crate) struct Released(Arc<Region>);

impl Released {
    /// The word in `region`.
    #[cfg(test)]
    pub(crate) fn of(region: Arc<Region>) -> Self {
        Self(region)
    }

    /// The answers released so far: every one up to this sequence number.
    pub(crate) fn load(&self) -> u64 {
        self.0.words()[RELEASED_WORD].load(Ordering::Acquire)
    }

    /// Says the worker is done with answer `seq`'s arena payloads (and so
    /// with every earlier answer's: answers are read in order).
    pub(crate) fn store(&self, seq: u64) {
        self.0.words()[RELEASED_WORD].fetch_max(seq, Ordering::Release);
    }
}

/// What both ends of a ring share.
#[derive(Debug)]
struct End {
    region: Arc<Region>,
    layout: Layout,
    /// The bell this end sleeps on.
    mine: Bell,
    /// The bell the other end sleeps on.
    theirs: Ringer,
    /// Whether the last wait was shorter than [`SHORT_WAIT`]: only then does
    /// the next one spin first (a peer that keeps this end waiting longer, such as a
    /// worker computing a large model's step, would only have its core taken).
    spin: AtomicBool,
    /// The runtime the peer's tasks run on, when the handshake found it to be
    /// this end's own ([`End::peer_on_this_runtime`]); a wait polled by a
    /// task of it takes its turns among the peer's ([`Turns::AmongPeers`]).
    peer_runtime: Option<tokio::runtime::Id>,
}

impl End {
    /// Marks the peer's tasks as running on the current runtime.
    fn peer_on_this_runtime(&mut self) {
        self.peer_runtime = tokio::runtime::Handle::try_current()
            .ok()
            .map(|runtime| runtime.id());
    }

    /// How a spinning wait polled here takes its turns.
    fn turns(&self) -> Turns {
        match self.peer_runtime {
            Some(peer) if in_a_task_of(peer) => Turns::AmongPeers,
            _ => Turns::Apart,
        }
    }

    fn word(&self, index: usize) -> &AtomicU64 {
        &self.region.words()[index]
    }

    /// The ring's data words from position `at` for up to `len` words, cut
    /// where the ring wraps: `(first word index, words)`.
    fn span(&self, at: u64, len: u64) -> (usize, usize) {
        let offset = at % self.layout.capacity;
        let len = len.min(self.layout.capacity - offset);
        (self.layout.data + offset as usize, len as usize)
    }

    /// Stores `position` in `control` and rings the other end if its
    /// `their_waiting` word says it sleeps.
    fn publish(&self, control: usize, position: u64, their_waiting: usize) {
        self.word(control).store(position, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.word(their_waiting).load(Ordering::SeqCst) != 0 {
            self.word(their_waiting).store(0, Ordering::Relaxed);
            self.theirs.ring();
        }
    }

    /// Waits until `ready` gives a value: spinning for [`SPIN`], then asleep
    /// on this end's bell with `my_waiting` set.
    async fn wait<T>(
        &self,
        my_waiting: usize,
        mut ready: impl FnMut() -> Result<Option<T>, RingError>,
    ) -> Result<T, RingError> {
        if let Some(value) = ready()? {
            return Ok(value);
        }
        let started = Instant::now();
        let spin = self.spin.load(Ordering::Relaxed);
        // Resolved at the first turn of a spin: many waits end before it.
        let mut turns = None;
        loop {
            if let Some(value) = ready()? {
                self.spin
                    .store(started.elapsed() < SHORT_WAIT, Ordering::Relaxed);
                return Ok(value);
            }
            let waited = started.elapsed();
            if spin && waited < SPIN {
                // The runtime's yield lets this thread's other tasks run; the
                // system's, later, lets the peer run on this core when there
                // are more busy threads than cores.
                let turns = *turns.get_or_insert_with(|| self.turns());
                if waited >= turns.yield_core_after() {
                    std::thread::yield_now();
                }
                turns.take().await;
                continue;
            }
            self.word(my_waiting).store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if let Some(value) = ready()? {
                self.word(my_waiting).store(0, Ordering::Relaxed);
                self.spin
                    .store(started.elapsed() < SHORT_WAIT, Ordering::Relaxed);
                return Ok(value);
            }
            self.mine.wait().await?;
        }
    }
}

/// How a spinning wait gives way at each turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turns {
    /// Polled by a task of the runtime its peer's tasks run on (`ps-local`):
    /// the wait goes straight to the back of its thread's queue, behind the
    /// tasks it waits for ([`RequeueOnce`]), and gives its core to the
    /// system only after [`YIELD_CORE_AFTER_PEER_HERE`].
    AmongPeers,
    /// Anywhere else (the peer in another process, on another runtime, or
    /// this wait in a `block_on`): through `tokio::task::yield_now`, which in
    /// a task lets the thread poll its drivers first, and to the system after
    /// [`YIELD_CORE_AFTER`].
    Apart,
}

impl Turns {
    /// How long a spinning wait lets only its runtime's tasks run before it
    /// also gives its core to the system at each turn.
    fn yield_core_after(self) -> Duration {
        match self {
            Self::AmongPeers => YIELD_CORE_AFTER_PEER_HERE,
            Self::Apart => YIELD_CORE_AFTER,
        }
    }

    /// Lets the thread's other tasks run once.
    async fn take(self) {
        match self {
            Self::AmongPeers => RequeueOnce(false).await,
            Self::Apart => tokio::task::yield_now().await,
        }
    }
}

/// Wakes its task and is pending once, then ready: the task goes to the back
/// of its thread's queue. `tokio::task::yield_now` defers the wake until the
/// thread has polled its drivers (`epoll_wait`, the timer wheel), a system
/// call at each turn: 80-100 a step of a one-worker `ps-local`, 7-8 this way
/// (docs/benchmarks.md, "Ring waits among their peers' tasks").
struct RequeueOnce(bool);

impl std::future::Future for RequeueOnce {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Marks one side's two ends of a session, `reading` and `writing`, as
/// having their peer's tasks on the current runtime (see
/// [`YIELD_CORE_AFTER_PEER_HERE`]).
pub(crate) fn peer_on_this_runtime(reading: &mut RingReader, writing: &mut RingWriter) {
    reading.end.peer_on_this_runtime();
    writing.end.peer_on_this_runtime();
}

/// What one side's two ends of a session, `reading` and `writing`, know of
/// their peer: its runtime when it is theirs, and whether they sleep on
/// in-process doorbells.
#[cfg(test)]
pub(crate) fn peer_known(
    reading: &RingReader,
    writing: &RingWriter,
) -> [(Option<tokio::runtime::Id>, bool); 2] {
    [&reading.end, &writing.end].map(|end| (end.peer_runtime, end.mine.is_in_process()))
}

/// Whether this thread is polling a task of runtime `id` (not a `block_on`
/// of it, whose future runs no other task at its yields).
fn in_a_task_of(id: tokio::runtime::Id) -> bool {
    tokio::task::try_id().is_some()
        && tokio::runtime::Handle::try_current().is_ok_and(|runtime| runtime.id() == id)
}

/// The writing end of a ring.
#[derive(Debug)]
pub struct RingWriter {
    end: End,
    /// Words written (published or not).
    tail: u64,
    /// Words written and published.
    published: u64,
    /// A `head` the reader stored: a later one lower than this is corrupt,
    /// not a smaller room to wait for.
    head_seen: AtomicU64,
    /// How large writes are copied in.
    stores: Stores,
}

/// The reading end of a ring.
#[derive(Debug)]
pub struct RingReader {
    end: End,
    /// Words read.
    head: u64,
}

impl RingWriter {
    /// The writing end of `direction`'s ring in `region`, whose rings hold
    /// `capacity_words` each; sleeps on `mine`, rings `theirs`.
    pub(crate) fn new(
        region: Arc<Region>,
        direction: Direction,
        capacity_words: usize,
        (mine, theirs): (Bell, Ringer),
    ) -> Self {
        let layout = Layout::of(direction, capacity_words);
        // A new region's rings start empty; nothing the peer may have
        // written there since is trusted.
        let tail = 0;
        let end = End {
            region,
            layout,
            mine,
            theirs,
            spin: AtomicBool::new(true),
            peer_runtime: None,
        };
        Self {
            end,
            tail,
            published: tail,
            head_seen: AtomicU64::new(0),
            stores: Stores::default(),
        }
    }

    /// Writes `bytes` as whole words (the last one padded with zeros), waiting
    /// for room as the reader frees it. A large write is copied by the
    /// stores that have cost least lately, and timed, waits included, for
    /// the next choice ([`crate::stores`]).
    ///
    /// # Errors
    /// The reader's `head` is corrupt, or the bell failed.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), RingError> {
        let kind = self.stores.pick(bytes.len());
        let streaming = kind == Some(Kind::Streaming);
        let started = kind.map(|_| Instant::now());
        let mut done = 0;
        while done < bytes.len() {
            let left = (bytes.len() - done).div_ceil(8) as u64;
            let room = self.room().await?;
            let (first, len) = self.end.span(self.tail, room.min(left).min(PUBLISH_WORDS));
            let now = (len * 8).min(bytes.len() - done);
            let whole = now - now % 8;
            let region = &self.end.region;
            region.copy_in_by(first, &bytes[done..done + whole], streaming);
            if whole < now {
                let mut last = [0u8; 8];
                last[..now - whole].copy_from_slice(&bytes[done + whole..done + now]);
                region.copy_in(first + whole / 8, &last);
            }
            done += now;
            self.tail += len as u64;
            if self.tail - self.published >= PUBLISH_WORDS {
                self.flush();
            }
        }
        if let (Some(kind), Some(started)) = (kind, started) {
            self.stores.learn(kind, bytes.len(), started.elapsed());
        }
        Ok(())
    }

    /// Writes one word.
    ///
    /// # Errors
    /// As [`RingWriter::write`].
    pub async fn write_word(&mut self, word: u64) -> Result<(), RingError> {
        self.write(&word.to_le_bytes()).await
    }

    /// The words written so far. [`RingWriter::write`] counts each span
    /// once it is copied, and waits only between spans, so a write cut off
    /// at any await has written exactly this far.
    pub(crate) fn position(&self) -> u64 {
        self.tail
    }

    /// Publishes every word written so far to the reader.
    pub fn flush(&mut self) {
        if self.published != self.tail {
            let layout = self.end.layout;
            self.end
                .publish(layout.tail, self.tail, layout.reader_waiting);
            self.published = self.tail;
        }
    }

    /// Whether the reader sleeps on its bell: it found nothing more to read
    /// in what was published (spinning first when its last wait was short),
    /// and no write has been published since. The word is the peer's to set,
    /// so this is for tests and fuzzers, which drive both ends: a peer that
    /// reads as it should then waits for this writer alone.
    pub fn reader_sleeps(&self) -> bool {
        let word = self.end.word(self.end.layout.reader_waiting);
        word.load(Ordering::SeqCst) != 0
    }

    /// The words free now: a write of up to this many never waits.
    ///
    /// # Errors
    /// The reader's `head` is corrupt.
    pub(crate) fn free_words(&self) -> Result<u64, RingError> {
        free_behind(&self.end, self.tail, &self.head_seen)
    }

    /// Free words, waiting (with what was written published) until there are some.
    async fn room(&mut self) -> Result<u64, RingError> {
        if let Some(room) = Some(self.free_words()?).filter(|&f| f > 0) {
            return Ok(room);
        }
        self.flush();
        let (tail, seen) = (self.tail, &self.head_seen);
        let some =
            |end: &End| free_behind(end, tail, seen).map(|free| Some(free).filter(|&f| f > 0));
        self.end
            .wait(self.end.layout.writer_waiting, || some(&self.end))
            .await
    }
}

/// The words free in `end`'s ring with its writer's tail at `tail`, the
/// reader's `head` having been at least `seen` before (and recorded there).
fn free_behind(end: &End, tail: u64, seen: &AtomicU64) -> Result<u64, RingError> {
    let layout = end.layout;
    // Read before the head: whatever a caller recorded there, it had read
    // before this read of the head, which cannot then find an older head from
    // a well-behaved reader, however callers interleave.
    let before = seen.load(Ordering::Acquire);
    let head = end.word(layout.head).load(Ordering::Acquire);
    if head > tail || tail - head > layout.capacity {
        return Err(RingError::Corrupt(format!(
            "the reader's head {head} is not within the ring behind the tail {tail}"
        )));
    }
    if head < before {
        return Err(RingError::Corrupt(format!(
            "the reader's head moved backward, from {before} to {head}"
        )));
    }
    if head > before {
        seen.store(head, Ordering::Release);
    }
    Ok(layout.capacity - (tail - head))
}

impl RingReader {
    /// The region's word for answers released ([`Released`]).
    pub(crate) fn released(&self) -> Released {
        Released(Arc::clone(&self.end.region))
    }

    /// The reading end of `direction`'s ring in `region`, whose rings hold
    /// `capacity_words` each; sleeps on `mine`, rings `theirs`.
    pub(crate) fn new(
        region: Arc<Region>,
        direction: Direction,
        capacity_words: usize,
        (mine, theirs): (Bell, Ringer),
    ) -> Self {
        let layout = Layout::of(direction, capacity_words);
        let head = 0;
        let end = End {
            region,
            layout,
            mine,
            theirs,
            spin: AtomicBool::new(true),
            peer_runtime: None,
        };
        Self { end, head }
    }

    /// Reads `into.len()` bytes, as whole words (the padding of the last one
    /// dropped), waiting for the writer as needed.
    ///
    /// # Errors
    /// The writer's `tail` is corrupt, or the bell failed.
    pub async fn read(&mut self, into: &mut [u8]) -> Result<(), RingError> {
        self.read_marked(into, None, &mut |_, _| {}).await
    }

    /// [`RingReader::read`], testing for `mark`'s elements in the same pass
    /// as the copy (`into` read as elements from its start), and handing
    /// `marked` each piece that holds one, while it is still in this core's
    /// cache: its offset in `into` and its bytes. Pieces are at most
    /// [`PUBLISH_WORDS`] words and, but for the last, whole words.
    ///
    /// # Errors
    /// As [`RingReader::read`].
    pub async fn read_marked(
        &mut self,
        into: &mut [u8],
        mark: Option<Mark>,
        marked: &mut (dyn FnMut(usize, &[u8]) + Send),
    ) -> Result<(), RingError> {
        let mut done = 0;
        while done < into.len() {
            let left = (into.len() - done).div_ceil(8) as u64;
            let ready = self.ready().await?;
            let (first, len) = self.end.span(self.head, ready.min(left).min(PUBLISH_WORDS));
            let now = (len * 8).min(into.len() - done);
            let whole = now - now % 8;
            let region = &self.end.region;
            let mut found = match mark {
                Some(mark) => region.copy_out_marked(first, &mut into[done..done + whole], mark),
                None => {
                    region.copy_out(first, &mut into[done..done + whole]);
                    false
                }
            };
            if whole < now {
                let mut last = [0u8; 8];
                region.copy_out(first + whole / 8, &mut last);
                let tail = &mut into[done + whole..done + now];
                tail.copy_from_slice(&last[..now - whole]);
                found |= mark.is_some_and(|mark| mark.any_in(tail));
            }
            if found {
                marked(done, &into[done..done + now]);
            }
            done += now;
            self.head += len as u64;
            let layout = self.end.layout;
            self.end
                .publish(layout.head, self.head, layout.writer_waiting);
        }
        Ok(())
    }

    /// The words read so far. [`RingReader::read`] counts each span only once
    /// it is copied, and waits only between spans, so a read cut off at any
    /// await has read exactly this far.
    pub(crate) fn position(&self) -> u64 {
        self.head
    }

    /// Reads one word.
    ///
    /// # Errors
    /// As [`RingReader::read`].
    pub async fn read_word(&mut self) -> Result<u64, RingError> {
        let mut word = [0u8; 8];
        self.read(&mut word).await?;
        Ok(u64::from_le_bytes(word))
    }

    /// Words written and not yet read, waiting until there are some.
    async fn ready(&self) -> Result<u64, RingError> {
        self.ready_at_least(1).await
    }

    /// Words written and not yet read, waiting until there are at least
    /// `words` (no more than the ring holds); reads nothing.
    ///
    /// # Errors
    /// As [`RingReader::read`].
    pub(crate) async fn ready_at_least(&self, words: u64) -> Result<u64, RingError> {
        let (head, layout) = (self.head, self.end.layout);
        let words = words.clamp(1, layout.capacity);
        let ready = |end: &End| {
            let tail = end.word(layout.tail).load(Ordering::Acquire);
            if tail < head || tail - head > layout.capacity {
                return Err(RingError::Corrupt(format!(
                    "the writer's tail {tail} is not within the ring ahead of the head {head}"
                )));
            }
            Ok(Some(tail - head).filter(|&ready| ready >= words))
        };
        self.end
            .wait(layout.reader_waiting, || ready(&self.end))
            .await
    }

    /// The word `offset` words past those read, which must be among those
    /// [`RingReader::ready_at_least`] found written; reads nothing.
    pub(crate) fn peek_word(&self, offset: u64) -> u64 {
        let (first, _) = self.end.span(self.head + offset, 1);
        let mut word = [0u8; 8];
        self.end.region.copy_out(first, &mut word);
        u64::from_le_bytes(word)
    }

    /// The words the ring holds.
    pub(crate) fn capacity(&self) -> u64 {
        self.end.layout.capacity
    }

    /// The bytes the ring holds.
    pub fn capacity_bytes(&self) -> u64 {
        self.end.layout.capacity * 8
    }
}

/// Both ends of both rings over one region in this process, for tests:
/// `(worker's request writer, server's request reader, server's answer
/// writer, worker's answer reader)`. Their doorbells wait on the current
/// runtime.
///
/// # Errors
/// The system refused the region or a doorbell.
///
/// # Panics
/// Outside a runtime.
pub fn in_process(
    ring_bytes: u64,
) -> std::io::Result<(RingWriter, RingReader, RingWriter, RingReader)> {
    let here = tokio::runtime::Handle::current();
    in_process_on(ring_bytes, (&here, &here))
}

/// [`in_process`], the worker's doorbells waiting on runtime `worker` and
/// the server's on `server`, as two processes' would each on their own.
///
/// # Errors
/// As [`in_process`].
pub fn in_process_on(
    ring_bytes: u64,
    (worker, server): (&tokio::runtime::Handle, &tokio::runtime::Handle),
) -> std::io::Result<(RingWriter, RingReader, RingWriter, RingReader)> {
    let region = Arc::new(Region::create(region_bytes(ring_bytes) as usize)?);
    write_header(&region, ring_bytes);
    let capacity = (ring_bytes / 8) as usize;
    let bells = crate::handshake::Bells::create()?;
    let worker = {
        let _on = worker.enter();
        bells.worker_side()?
    };
    let server = {
        let _on = server.enter();
        bells.server_side()?
    };
    Ok((
        RingWriter::new(
            Arc::clone(&region),
            Direction::Requests,
            capacity,
            worker.requests,
        ),
        RingReader::new(
            Arc::clone(&region),
            Direction::Requests,
            capacity,
            server.requests,
        ),
        RingWriter::new(
            Arc::clone(&region),
            Direction::Answers,
            capacity,
            server.answers,
        ),
        RingReader::new(region, Direction::Answers, capacity, worker.answers),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a task of the runtime named counts as one: not the `block_on`
    /// of a test's body, nor a task of another runtime.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_counts_as_the_peers_runtime_only_in_a_task_of_it() {
        let here = tokio::runtime::Handle::current().id();
        assert!(!in_a_task_of(here), "a block_on is not a task");
        assert!(
            tokio::spawn(async move { in_a_task_of(here) })
                .await
                .unwrap()
        );
        let elsewhere = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let there = elsewhere.spawn(async move { in_a_task_of(here) });
        assert!(!there.await.unwrap());
        elsewhere.shutdown_background();
    }

    /// Ends whose peer runs on this runtime take their turns among its tasks
    /// only when a task of it waits; others, and a `block_on`, apart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_takes_its_turns_among_its_peers_tasks_in_a_task_of_their_runtime_alone() {
        let (mut writer, reader, _, _) = in_process(1 << 16).unwrap();
        assert_eq!(reader.end.turns(), Turns::Apart);
        writer.end.peer_on_this_runtime();
        assert_eq!(writer.end.turns(), Turns::Apart, "block_on");
        let in_a_task = tokio::spawn(async move { writer.end.turns() });
        assert_eq!(in_a_task.await.unwrap(), Turns::AmongPeers);
    }

    /// A turn taken among peers puts the task behind the thread's other
    /// tasks, and then goes on.
    #[tokio::test(flavor = "current_thread")]
    async fn a_turn_among_peers_lets_the_threads_other_tasks_run_first() {
        let ran = Arc::new(AtomicBool::new(false));
        let waiter = tokio::spawn({
            let ran = Arc::clone(&ran);
            async move {
                let other = tokio::spawn({
                    let ran = Arc::clone(&ran);
                    async move { ran.store(true, Ordering::SeqCst) }
                });
                assert!(!ran.load(Ordering::SeqCst));
                Turns::AmongPeers.take().await;
                (ran.load(Ordering::SeqCst), other)
            }
        });
        let turn = tokio::time::timeout(Duration::from_secs(10), waiter);
        let (ran_first, other) = turn.await.expect("the turn ended").unwrap();
        assert!(ran_first, "the other task ran during the turn");
        other.await.unwrap();
    }

    /// A reader's head that moves backward, which no well-behaved reader
    /// stores, is corrupt: taken as it is, it would shrink the room the
    /// writer waits for, and stall the writer as long as it stayed there.
    #[tokio::test]
    async fn a_head_moved_backward_is_corrupt() {
        let ring_bytes = crate::handshake::SMALLEST_RING_BYTES;
        let (mut writer, mut reader, _, _) = in_process(ring_bytes).unwrap();
        writer.write(&[7u8; 64]).await.unwrap();
        writer.flush();
        let mut read = [0u8; 64];
        reader.read(&mut read).await.unwrap();
        assert_eq!(writer.free_words().unwrap(), ring_bytes / 8);
        let head = reader.end.layout.head;
        reader.end.word(head).store(4, Ordering::Release);
        let error = writer.free_words().unwrap_err();
        assert!(
            error.to_string().contains("moved backward, from 8 to 4"),
            "{error}"
        );
        let error = writer.write(&[1u8; 8]).await.unwrap_err();
        assert!(matches!(error, RingError::Corrupt(_)), "{error}");
    }

    /// Large writes through a ring smaller than each, by both kinds of
    /// stores (each kind has a first round of its own), arrive exact and
    /// in order, odd lengths included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn large_writes_arrive_exact_whichever_stores_copy_them() {
        let ring_bytes = crate::handshake::SMALLEST_RING_BYTES;
        let (mut writer, mut reader, _, _) = in_process(ring_bytes).unwrap();
        let writes: Vec<Vec<u8>> = (0..2 * crate::stores::TRIAL_ROUND as usize + 1)
            .map(|n| {
                let len = 2 * ring_bytes as usize + 8 * n + n % 8;
                (0..len).map(|i| (i * 31 + n) as u8).collect()
            })
            .collect();
        let expected = writes.clone();
        let writing = tokio::spawn(async move {
            for bytes in &writes {
                writer.write(bytes).await.unwrap();
            }
            writer.flush();
            writer
        });
        for bytes in expected {
            let mut read = vec![0u8; bytes.len().next_multiple_of(8)];
            reader.read(&mut read).await.unwrap();
            assert_eq!(&read[..bytes.len()], &bytes[..]);
        }
        let writer = writing.await.unwrap();
        assert!(
            writer.stores.picked_both(),
            "both kinds of stores wrote: {:?}",
            writer.stores
        );
    }

    /// A reader with nothing to read sleeps once it has spun, which its
    /// writer sees; the writer's next publish wakes it and says so.
    #[tokio::test]
    async fn a_writer_sees_its_reader_sleep_until_it_publishes() {
        let ring_bytes = crate::handshake::SMALLEST_RING_BYTES;
        let (mut writer, mut reader, _, _) = in_process(ring_bytes).unwrap();
        assert!(!writer.reader_sleeps(), "nobody has waited yet");
        let reading = tokio::spawn(async move {
            let mut read = [0u8; 8];
            reader.read(&mut read).await.map(|()| read)
        });
        while !writer.reader_sleeps() {
            tokio::task::yield_now().await;
        }
        writer.write(&[9u8; 8]).await.unwrap();
        writer.flush();
        assert!(!writer.reader_sleeps(), "the publish rang the reader");
        assert_eq!(reading.await.unwrap().unwrap(), [9u8; 8]);
    }
}
