//! Session requests and answers as messages on a ring, their tensors carried
//! as raw bytes beside a protobuf header.
//!
//! A message is, in words: `header bytes | payload count << 32`, the sequence
//! number, one word per payload giving its length in bytes, then the header
//! (the `SessionRequest` or `SessionAnswer` with every tensor's `data` left
//! empty), then each payload; the header and each payload padded to a whole
//! word. The tensors' bytes are copied once into the ring by the writer and
//! once out of it by the reader; nothing encodes or decodes them.
//!
//! A payload of an answer may instead lie in the server's values arena
//! ([`crate::arena`]): its length word then has `IN_ARENA` set, and its
//! one word on the ring is the arena offset it starts at. Requests never
//! carry such payloads.
//!
//! Sequence numbers start at 1 and grow by one per message, so a message that
//! is replayed, skipped or read from the middle is refused
//! ([`MessageError::Sequence`]); a message is handed on only once all of its
//! words have arrived, so a writer that dies halfway leaves nothing behind.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use ps_proto::header::TensorHeader;
use ps_proto::key::ParamKey;
use ps_proto::v1;
use ps_proto::v1::session_answer::Outcome;
use ps_proto::v1::session_request::Op;

use crate::arena::{ARENA_FROM_BYTES, Arena, ArenaView, LEND_FROM_BYTES, Spot};
use crate::copy::Mark;
use crate::pool::{BufferPool, Hold};
use crate::ring::{RingError, RingReader, RingWriter};

/// The most bytes a message's header may claim. Row operations carry their
/// ids and rows in the header, so a client cuts them to fit it.
pub const HEADER_LIMIT: u64 = 16 << 20;

/// The most payloads one message may carry.
const PAYLOAD_COUNT_LIMIT: u64 = 1 << 20;

/// Set in a payload's length word when the payload lies in the server's
/// values arena: its one word on the ring is then its offset there.
pub(crate) const IN_ARENA: u64 = 1 << 63;

/// A payload's length in bytes, from its length word.
pub(crate) fn payload_len(word: u64) -> u64 {
    word & !IN_ARENA
}

/// The words a payload takes on the ring, from its length word.
pub(crate) fn ring_words(word: u64) -> u64 {
    match word & IN_ARENA {
        0 => word.div_ceil(8),
        _ => 1,
    }
}

/// Why a message cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    /// The ring failed.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The message is out of sequence: replayed, skipped, or misaligned.
    #[error("shared-memory message {got} arrived where {expected} was due")]
    Sequence {
        /// The sequence number due.
        expected: u64,
        /// The one the message carried.
        got: u64,
    },
    /// The message's sizes, header or payloads do not fit together.
    #[error("a malformed shared-memory message: {0}")]
    Malformed(String),
    /// The ring broke or the session ended before, or a read of an answer
    /// larger than the ring was cut off midway: the session cannot go on.
    #[error("the shared-memory session broke earlier: {0}")]
    Broken(String),
}

impl MessageError {
    /// Whether the other process simply went away (its doorbell closed)
    /// rather than wrote anything wrong.
    pub fn is_peer_gone(&self) -> bool {
        matches!(self, Self::Ring(RingError::Bell(e)) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// The tensors' bytes of a request or an answer, taken out in order.
pub trait Payloads: Message + Default {
    /// Takes every tensor's bytes out, leaving them empty.
    fn take_payloads(&mut self) -> Vec<Bytes>;
    /// How many tensors carry bytes, and so how many payloads must follow.
    fn payload_slots(&self) -> usize;
    /// Puts `payloads` back, in the order [`Payloads::take_payloads`] took them.
    fn put_payloads(&mut self, payloads: Vec<Bytes>);
}

/// A request's gradients' headers in the order of its payloads, each parsed
/// once (`None` where it does not parse: left to the push's own checks).
pub(crate) fn gradient_headers(request: &v1::SessionRequest) -> Vec<Option<TensorHeader>> {
    let push = match &request.op {
        Some(Op::Push(push)) => Some(push),
        Some(Op::PushPull(both)) => both.push.as_ref(),
        _ => None,
    };
    let grads = push.map(|push| push.grads.as_slice()).unwrap_or_default();
    grads
        .iter()
        .map(|grad| TensorHeader::from_wire(&grad.name, grad.part, grad.dtype, &grad.shape).ok())
        .collect()
}

fn tensors_of_push(push: &mut v1::PushRequest) -> impl Iterator<Item = &mut v1::Tensor> {
    push.grads.iter_mut()
}

fn request_tensors(request: &mut v1::SessionRequest) -> Vec<&mut v1::Tensor> {
    match &mut request.op {
        Some(Op::Push(push)) => tensors_of_push(push).collect(),
        Some(Op::PushPull(both)) => both
            .push
            .as_mut()
            .map(|push| tensors_of_push(push).collect())
            .unwrap_or_default(),
        Some(Op::Pull(_) | Op::PullRows(_) | Op::PushRows(_)) | None => Vec::new(),
    }
}

fn answer_tensors(answer: &mut v1::SessionAnswer) -> Vec<&mut v1::Tensor> {
    pulled_of(answer)
        .iter_mut()
        .filter_map(|pulled| pulled.tensor.as_mut())
        .collect()
}

/// The pulled tensors of an answer: a pull's, or a push-and-pull's.
fn pulled_of(answer: &mut v1::SessionAnswer) -> &mut [v1::PulledTensor] {
    match &mut answer.outcome {
        Some(Outcome::Pull(pull)) => &mut pull.tensors,
        Some(Outcome::PushPull(both)) => match &mut both.pull {
            Some(pull) => &mut pull.tensors,
            None => &mut [],
        },
        _ => &mut [],
    }
}

/// Says in `answer`, for each pulled tensor whose values lie in `arena`
/// from a block's start, where they lie ([`Arena::spot_of`]), so that the
/// worker may read them there again with no request.
pub(crate) fn tell_spots(answer: &mut v1::SessionAnswer, arena: &Arena) {
    for pulled in pulled_of(answer) {
        let spot = pulled
            .tensor
            .as_ref()
            .filter(|tensor| tensor.data.len() >= ARENA_FROM_BYTES)
            .and_then(|tensor| arena.spot_of(&tensor.data));
        pulled.arena = spot.map(|spot| v1::ArenaSpot {
            offset: spot.offset,
            len: spot.len,
            block: spot.id,
        });
    }
}

/// Remembers in `arena` where `answer` said each pulled tensor's values
/// lie ([`tell_spots`]), by the tensor's key.
pub(crate) fn remember_spots(answer: &mut v1::SessionAnswer, arena: &ArenaView) {
    for pulled in pulled_of(answer) {
        let (Some(tensor), Some(spot)) = (&pulled.tensor, &pulled.arena) else {
            continue;
        };
        let key = ParamKey::new(tensor.name.clone(), tensor.part);
        let spot = Spot {
            offset: spot.offset,
            len: spot.len,
            id: spot.block,
        };
        arena.remember(&key, spot);
    }
}

fn take(tensors: Vec<&mut v1::Tensor>) -> Vec<Bytes> {
    tensors
        .into_iter()
        .map(|t| std::mem::take(&mut t.data))
        .collect()
}

fn put(tensors: Vec<&mut v1::Tensor>, payloads: Vec<Bytes>) {
    for (tensor, data) in tensors.into_iter().zip(payloads) {
        tensor.data = data;
    }
}

impl Payloads for v1::SessionRequest {
    fn take_payloads(&mut self) -> Vec<Bytes> {
        take(request_tensors(self))
    }
    fn payload_slots(&self) -> usize {
        match &self.op {
            Some(Op::Push(push)) => push.grads.len(),
            Some(Op::PushPull(both)) => both.push.as_ref().map_or(0, |push| push.grads.len()),
            Some(Op::Pull(_) | Op::PullRows(_) | Op::PushRows(_)) | None => 0,
        }
    }
    fn put_payloads(&mut self, payloads: Vec<Bytes>) {
        put(request_tensors(self), payloads);
    }
}

impl Payloads for v1::SessionAnswer {
    fn take_payloads(&mut self) -> Vec<Bytes> {
        take(answer_tensors(self))
    }
    fn payload_slots(&self) -> usize {
        match &self.outcome {
            Some(Outcome::Pull(pull)) => pulled(pull),
            Some(Outcome::PushPull(both)) => both.pull.as_ref().map(pulled).unwrap_or(0),
            _ => 0,
        }
    }
    fn put_payloads(&mut self, payloads: Vec<Bytes>) {
        put(answer_tensors(self), payloads);
    }
}

fn pulled(pull: &v1::PullResponse) -> usize {
    pull.tensors.iter().filter(|t| t.tensor.is_some()).count()
}

/// Writes `message` (its tensors' bytes as payloads) as message `seq`, and
/// publishes it.
///
/// # Errors
/// The ring failed.
pub async fn write_message<M: Payloads>(
    ring: &mut RingWriter,
    seq: u64,
    message: M,
) -> Result<(), RingError> {
    Encoded::of(message).write(ring, seq).await
}

/// A message encoded for a ring: its header and its payloads, which a
/// write cut off midway keeps to write the rest from.
#[derive(Debug)]
pub(crate) struct Encoded {
    header: Vec<u8>,
    payloads: Vec<Bytes>,
    /// Each payload's offset in the values arena, where it is sent as that
    /// offset instead of its bytes.
    in_arena: Vec<Option<[u8; 8]>>,
}

impl Encoded {
    pub(crate) fn of<M: Payloads>(mut message: M) -> Self {
        let payloads = message.take_payloads();
        Self {
            header: message.encode_to_vec(),
            in_arena: vec![None; payloads.len()],
            payloads,
        }
    }

    /// Sends by their offset in `arena` the payloads of at least
    /// [`LEND_FROM_BYTES`] that lie wholly in it, as long as `room` takes
    /// their bytes; says how many bytes it sent so.
    pub(crate) fn lend_from(&mut self, arena: &Arena, room: &mut impl FnMut(u64) -> bool) -> u64 {
        let mut lent = 0;
        for (payload, slot) in self.payloads.iter().zip(&mut self.in_arena) {
            let len = payload.len() as u64;
            if payload.len() < LEND_FROM_BYTES {
                continue;
            }
            if let Some(offset) = arena.offset_of(payload).filter(|_| room(len)) {
                *slot = Some(offset.to_le_bytes());
                lent += len;
            }
        }
        lent
    }

    /// The payloads sent by their arena offset, which must stay as they are
    /// until the reader is done with them.
    pub(crate) fn lent_payloads(&self) -> Vec<Bytes> {
        let lent = self.in_arena.iter().map(Option::is_some);
        self.payloads
            .iter()
            .zip(lent)
            .filter(|&(_, lent)| lent)
            .map(|(payload, _)| payload.clone())
            .collect()
    }

    /// The words the message takes on a ring.
    pub(crate) fn ring_words(&self) -> u64 {
        let parts = self.payloads.iter().zip(&self.in_arena);
        let payloads: u64 = parts
            .map(|(payload, at)| match at {
                Some(_) => 1,
                None => payload.len().div_ceil(8) as u64,
            })
            .sum();
        // The sizes word, the sequence number and a length word per payload.
        2 + self.payloads.len() as u64 + self.header.len().div_ceil(8) as u64 + payloads
    }

    /// Writes the message as message `seq`, and publishes it.
    ///
    /// # Errors
    /// The ring failed.
    pub(crate) async fn write(self, ring: &mut RingWriter, seq: u64) -> Result<(), RingError> {
        self.write_from(ring, seq, 0).await
    }

    /// Writes the message as message `seq` past its first `done` words
    /// (those a write cut off midway got to), and publishes it.
    ///
    /// # Errors
    /// The ring failed.
    pub(crate) async fn write_from(
        &self,
        ring: &mut RingWriter,
        seq: u64,
        mut done: u64,
    ) -> Result<(), RingError> {
        let sizes = self.header.len() as u64 | (self.payloads.len() as u64) << 32;
        let lens = self
            .payloads
            .iter()
            .zip(&self.in_arena)
            .map(|(payload, at)| {
                let flag = if at.is_some() { IN_ARENA } else { 0 };
                payload.len() as u64 | flag
            });
        for word in [sizes, seq].into_iter().chain(lens) {
            match done {
                0 => ring.write_word(word).await?,
                _ => done -= 1,
            }
        }
        let payloads = self.payloads.iter().zip(&self.in_arena);
        let parts = payloads.map(|(payload, at)| match at {
            Some(offset) => &offset[..],
            None => &payload[..],
        });
        let parts = std::iter::once(&self.header[..]).chain(parts);
        for part in parts {
            let words = part.len().div_ceil(8) as u64;
            if done >= words {
                done -= words;
                continue;
            }
            ring.write(&part[done as usize * 8..]).await?;
            done = 0;
        }
        ring.flush();
        Ok(())
    }
}

/// A message read off a ring.
#[derive(Debug)]
pub enum Arrived<M> {
    /// The whole message, its payloads put back.
    Whole(M),
    /// A message whose payloads were past the limit: its header alone (the
    /// payloads were read past and dropped), and why it is refused. The ring
    /// stays aligned, so the session goes on.
    PastLimit(M, String),
}

/// A message whose header has been read and whose payloads are still on
/// the ring: the reader decides whether to take them ([`Head::read_payloads`])
/// or read past them ([`Head::skip`]); either way the ring stays aligned.
#[derive(Debug)]
pub struct Head<M> {
    /// The message, its tensors' bytes still empty.
    pub message: M,
    /// The payloads' length words ([`IN_ARENA`] set on those in the arena).
    lens: Vec<u64>,
    total: u64,
    /// The server's values arena, for the payloads that lie in it.
    arena: Option<Arc<ArenaView>>,
}

impl<M: Payloads> Head<M> {
    /// The bytes of all its payloads together.
    pub fn payload_bytes(&self) -> u64 {
        self.total
    }

    /// Whether a payload lies in the values arena.
    pub(crate) fn has_arena_payloads(&self) -> bool {
        self.lens.iter().any(|len| len & IN_ARENA != 0)
    }

    /// Copies the payloads into buffers of `pool`, each holding `hold` (such
    /// as a memory charge) until it is dropped, and puts them back into the
    /// message.
    ///
    /// # Errors
    /// The ring failed.
    pub async fn read_payloads(
        self,
        ring: &mut RingReader,
        pool: &BufferPool,
        hold: Option<Hold>,
    ) -> Result<M, RingError> {
        self.read_payloads_marked(ring, pool, hold, &[], &mut |_, _, _| {})
            .await
    }

    /// [`Head::read_payloads`], testing payload `i` for `marks[i]`'s
    /// elements as it is copied (see [`RingReader::read_marked`]; a payload
    /// past `marks` or with `None` is not tested), and handing `marked` each
    /// piece that holds one: the payload's index, the piece's offset in it,
    /// and its bytes.
    ///
    /// # Errors
    /// The ring failed.
    pub async fn read_payloads_marked(
        mut self,
        ring: &mut RingReader,
        pool: &BufferPool,
        hold: Option<Hold>,
        marks: &[Option<Mark>],
        marked: &mut (dyn FnMut(usize, usize, &[u8]) + Send),
    ) -> Result<M, RingError> {
        let mut payloads = Vec::with_capacity(self.lens.len());
        for (index, &word) in self.lens.iter().enumerate() {
            let mut payload = pool.take(payload_len(word) as usize);
            if word & IN_ARENA != 0 {
                copy_from_arena(ring, self.arena.as_deref(), &mut payload).await?;
                payloads.push(pool.bytes(payload, hold.clone()));
                continue;
            }
            let mark = marks.get(index).copied().flatten();
            let mut piece = |offset: usize, bytes: &[u8]| marked(index, offset, bytes);
            ring.read_marked(&mut payload, mark, &mut piece).await?;
            payloads.push(pool.bytes(payload, hold.clone()));
        }
        self.message.put_payloads(payloads);
        Ok(self.message)
    }

    /// The message, its tensors' bytes empty, the length words of the
    /// payloads still on the ring, and the arena those in it lie in.
    pub(crate) fn into_parts(self) -> (M, Vec<u64>, Option<Arc<ArenaView>>) {
        (self.message, self.lens, self.arena)
    }

    /// Reads past the payloads, leaving the message without them.
    ///
    /// # Errors
    /// The ring failed.
    pub async fn skip(self, ring: &mut RingReader) -> Result<M, RingError> {
        skip(ring, &self.lens).await?;
        Ok(self.message)
    }
}

/// Waits, reading nothing, until the next message's head (its sizes, its
/// payloads' lengths and its header) is on the ring whole, and, when its
/// payloads come to less than `whole_below` bytes, until the whole message
/// is: reading that much then never waits, so it cannot be cut off midway.
/// A head or message larger than the ring is not waited for (it can only
/// be read as it comes).
///
/// # Errors
/// The ring failed.
pub(crate) async fn wait_whole(ring: &RingReader, whole_below: u64) -> Result<(), RingError> {
    let capacity = ring.capacity();
    ring.ready_at_least(1).await?;
    let sizes = ring.peek_word(0);
    let (header_len, count) = (sizes & 0xffff_ffff, sizes >> 32);
    let head_words = 2 + count + header_len.div_ceil(8);
    if head_words > capacity {
        return Ok(());
    }
    ring.ready_at_least(head_words).await?;
    let lens = (0..count).map(|i| ring.peek_word(2 + i));
    let (bytes, words) = lens.fold((0u64, 0u64), |(bytes, words), len| {
        (
            bytes.saturating_add(payload_len(len)),
            words.saturating_add(ring_words(len)),
        )
    });
    let whole = head_words.saturating_add(words);
    if bytes < whole_below && whole <= capacity {
        ring.ready_at_least(whole).await?;
    }
    Ok(())
}

/// Reads message `seq`'s header, leaving its payloads on the ring; payloads
/// may lie in `arena` (without one, a payload that claims to is malformed).
///
/// # Errors
/// [`MessageError`]: the ring failed, the message is out of sequence, or it is
/// malformed.
pub async fn read_head<M: Payloads>(
    ring: &mut RingReader,
    seq: u64,
    arena: Option<&Arc<ArenaView>>,
) -> Result<Head<M>, MessageError> {
    let sizes = ring.read_word().await?;
    let (header_len, count) = (sizes & 0xffff_ffff, sizes >> 32);
    let got = ring.read_word().await?;
    if got != seq {
        return Err(MessageError::Sequence { expected: seq, got });
    }
    if header_len > HEADER_LIMIT || count > PAYLOAD_COUNT_LIMIT {
        return Err(MessageError::Malformed(format!(
            "a header of {header_len} bytes and {count} payloads is past the limits"
        )));
    }
    let mut lens = Vec::with_capacity(count as usize);
    for _ in 0..count {
        lens.push(ring.read_word().await?);
    }
    if arena.is_none() && lens.iter().any(|len| len & IN_ARENA != 0) {
        return Err(MessageError::Malformed(
            "a payload claims to lie in a values arena this session has none of".to_string(),
        ));
    }
    let total = lens
        .iter()
        .try_fold(0u64, |sum, &len| sum.checked_add(payload_len(len)));
    let Some(total) = total else {
        return Err(MessageError::Malformed(format!(
            "{count} payloads whose lengths overflow"
        )));
    };
    let mut header = vec![0u8; header_len as usize];
    ring.read(&mut header).await?;
    let message = M::decode(header.as_slice())
        .map_err(|e| MessageError::Malformed(format!("the header does not decode: {e}")))?;
    if message.payload_slots() != lens.len() {
        return Err(MessageError::Malformed(format!(
            "{} payloads for {} tensors",
            lens.len(),
            message.payload_slots()
        )));
    }
    Ok(Head {
        message,
        lens,
        total,
        arena: arena.cloned(),
    })
}

/// Reads a payload's arena offset off `ring` and copies the payload from
/// `arena` into `into` (its length).
///
/// # Errors
/// The ring failed, or the payload does not lie in the arena (corrupt).
pub(crate) async fn copy_from_arena(
    ring: &mut RingReader,
    arena: Option<&ArenaView>,
    into: &mut [u8],
) -> Result<(), RingError> {
    let offset = ring.read_word().await?;
    let Some(arena) = arena else {
        return Err(RingError::Corrupt(
            "a payload in a missing arena".to_string(),
        ));
    };
    arena.copy_out(offset, into).map_err(RingError::Corrupt)
}

/// Reads message `seq`: its header, with the payloads (no more than
/// `payload_limit` bytes in all, each copied into a buffer of `pool`) put
/// back into its tensors.
///
/// # Errors
/// As [`read_head`].
pub async fn read_message<M: Payloads>(
    ring: &mut RingReader,
    seq: u64,
    payload_limit: u64,
    pool: &BufferPool,
) -> Result<Arrived<M>, MessageError> {
    let head = read_head::<M>(ring, seq, None).await?;
    let total = head.payload_bytes();
    if total > payload_limit {
        let message = head.skip(ring).await?;
        let why = format!(
            "a message carrying {total} bytes of tensors is past the limit of {payload_limit}"
        );
        return Ok(Arrived::PastLimit(message, why));
    }
    Ok(Arrived::Whole(head.read_payloads(ring, pool, None).await?))
}

/// Reads past payloads of `lens` bytes (each padded to whole words).
async fn skip(ring: &mut RingReader, lens: &[u64]) -> Result<(), RingError> {
    skip_words(ring, lens.iter().copied().map(ring_words).sum()).await
}

/// Reads past `words` words (none: returns at once, with nothing
/// allocated; a reader calls this before every message).
pub(crate) async fn skip_words(ring: &mut RingReader, words: u64) -> Result<(), RingError> {
    let Some(mut left) = words.checked_mul(8) else {
        return Err(RingError::Corrupt(format!(
            "{words} words to read past: more than a ring can ever hold"
        )));
    };
    if left == 0 {
        return Ok(());
    }
    let mut scratch = vec![0u8; left.min(64 << 10) as usize];
    while left > 0 {
        let now = left.min(scratch.len() as u64) as usize;
        ring.read(&mut scratch[..now]).await?;
        left -= now as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A push of payloads of `lens` bytes (lengths not whole words
    /// included), each a pattern of its own.
    fn push(lens: &[usize]) -> v1::SessionRequest {
        let grads = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| v1::Tensor {
                name: format!("w{i}"),
                part: 0,
                dtype: v1::DType::DtypeF32 as i32,
                shape: vec![len as u64],
                data: Bytes::from((0..len).map(|b| (b * 7 + i) as u8).collect::<Vec<_>>()),
            })
            .collect();
        v1::SessionRequest {
            id: 9,
            deadline_ms: 0,
            op: Some(Op::Push(v1::PushRequest {
                worker_id: 1,
                step: 2,
                map_version: 0,
                grads,
            })),
        }
    }

    /// The words `write` leaves on a fresh ring (checked to be `words`, no
    /// more and no fewer), read back raw.
    async fn words_written(
        words: usize,
        write: impl AsyncFnOnce(&mut RingWriter) -> Result<(), RingError>,
    ) -> Vec<u8> {
        let (mut writer, mut reader, _, _) = crate::ring::in_process(1 << 16).unwrap();
        write(&mut writer).await.unwrap();
        assert_eq!(writer.position(), words as u64, "words written");
        let mut bytes = vec![0u8; words * 8];
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(10), reader.read(&mut bytes));
        read.await.expect("the words were published").unwrap();
        bytes
    }

    /// An answer of one pulled tensor holding `data`.
    fn pulled(data: Bytes) -> v1::SessionAnswer {
        let tensor = v1::Tensor {
            name: "w".to_string(),
            part: 0,
            dtype: v1::DType::DtypeF32 as i32,
            shape: vec![data.len() as u64 / 4],
            data,
        };
        let pulled = v1::PulledTensor {
            version: 1,
            arena: None,
            tensor: Some(tensor),
        };
        v1::SessionAnswer {
            id: 4,
            outcome: Some(Outcome::Pull(v1::PullResponse {
                tensors: vec![pulled],
            })),
            pull_waited_us: 0,
        }
    }

    /// An answer pulling `named` tensors, each as its bytes.
    fn pulling(named: Vec<(&str, Bytes)>) -> v1::SessionAnswer {
        let mut answer = pulled(Bytes::new());
        let Some(Outcome::Pull(pull)) = &mut answer.outcome else {
            unreachable!("a pull's answer")
        };
        let one = pull.tensors.pop().expect("one tensor");
        pull.tensors = named
            .into_iter()
            .map(|(name, data)| {
                let mut pulled = one.clone();
                let tensor = pulled.tensor.as_mut().expect("a tensor");
                (tensor.name, tensor.shape) = (name.to_string(), vec![data.len() as u64 / 4]);
                tensor.data = data;
                pulled
            })
            .collect();
        answer
    }

    /// An answer says where each of its pulled values lie in the arena (from
    /// a block's start), and the worker remembers it by key and reads them
    /// there; values on the heap get no spot. A spot told of a block freed
    /// before the worker reads it never reads the block placed there next,
    /// another key's.
    #[test]
    fn an_answer_tells_where_its_values_lie_and_a_freed_blocks_spot_reads_nothing() {
        let arena = Arena::create(1 << 20).unwrap();
        arena.publish_map(Some(0));
        let file = arena.file().try_clone_to_owned().unwrap();
        let view = ArenaView::open(file, arena.bytes(), true).unwrap();
        let block = Arc::new(arena.block(&[2.0f32; ARENA_FROM_BYTES / 4]).unwrap());
        block.publish(Some(3));
        let in_arena = crate::arena::shared_bytes(Arc::clone(&block));
        let on_heap = Bytes::from(vec![0u8; ARENA_FROM_BYTES]);
        let mut answer = pulling(vec![("a", in_arena.clone()), ("b", on_heap)]);
        tell_spots(&mut answer, &arena);
        remember_spots(&mut answer, &view);
        let spot = view.spot_of(&ParamKey::new("a", 0)).expect("told");
        let at = arena.offset_of(&in_arena).unwrap();
        assert_eq!((spot.offset, spot.len), (at, ARENA_FROM_BYTES as u64));
        assert_eq!(view.spot_of(&ParamKey::new("b", 0)), None, "on the heap");
        let mut into = vec![0u8; ARENA_FROM_BYTES];
        assert_eq!(view.read_current(spot, (3, 0), &mut into), Some(3));
        assert_eq!(into, in_arena);

        drop((answer, in_arena));
        drop(Arc::into_inner(block).expect("the last holder"));
        let other = arena.block(&[9.0f32; ARENA_FROM_BYTES / 4]).unwrap();
        other.publish(Some(5));
        assert_eq!(
            other.offset(),
            spot.offset,
            "placed where the freed one was"
        );
        assert_eq!(view.read_current(spot, (0, 0), &mut into), None);
    }

    /// A payload in the arena goes as one word, its offset, and a reader
    /// given the arena's view reads the values from there; a reader without
    /// one refuses the message, and one given an offset past the arena's end
    /// fails with the ring corrupt, copying nothing.
    #[tokio::test]
    async fn a_payload_in_the_arena_goes_by_its_offset_and_is_read_from_there() {
        let arena = crate::arena::Arena::create(1 << 20).unwrap();
        let values: Vec<f32> = (0..LEND_FROM_BYTES / 4).map(|i| i as f32).collect();
        let block = Arc::new(arena.block(&values).unwrap());
        let bytes = crate::arena::shared_bytes(Arc::clone(&block));
        let mut message = Encoded::of(pulled(bytes.clone()));
        let mut asked = Vec::new();
        let lent = message.lend_from(&arena, &mut |len| {
            asked.push(len);
            true
        });
        assert_eq!(
            (lent, asked),
            (bytes.len() as u64, vec![bytes.len() as u64])
        );
        assert_eq!(message.lent_payloads(), vec![bytes.clone()]);
        let words = 2 + 1 + message.header.len().div_ceil(8) + 1;
        assert_eq!(message.ring_words(), words as u64, "as counted before");
        let written = words_written(words, async |ring| message.write(ring, 1).await).await;
        assert_eq!(
            written.len(),
            words * 8,
            "the values did not go on the ring"
        );

        let view = Arc::new(
            crate::arena::ArenaView::open(
                arena.file().try_clone_to_owned().unwrap(),
                arena.bytes(),
                true,
            )
            .unwrap(),
        );
        let (_w, mut reader) = ring_of(&written).await;
        let head = read_head::<v1::SessionAnswer>(&mut reader, 1, Some(&view))
            .await
            .unwrap();
        assert!(head.has_arena_payloads());
        assert_eq!(head.payload_bytes(), bytes.len() as u64);
        let read = head
            .read_payloads(&mut reader, &BufferPool::new(), None)
            .await
            .unwrap();
        assert_eq!(
            read,
            pulled(bytes.clone()),
            "the values, read from the arena"
        );

        let (_w, mut reader) = ring_of(&written).await;
        let refused = read_head::<v1::SessionAnswer>(&mut reader, 1, None).await;
        assert!(
            matches!(refused, Err(MessageError::Malformed(_))),
            "no arena here"
        );

        let mut past = written.clone();
        let at = past.len() - 8;
        past[at..].copy_from_slice(&arena.bytes().to_le_bytes());
        let (_w, mut reader) = ring_of(&past).await;
        let head = read_head::<v1::SessionAnswer>(&mut reader, 1, Some(&view))
            .await
            .unwrap();
        let failed = head
            .read_payloads(&mut reader, &BufferPool::new(), None)
            .await;
        assert!(
            matches!(failed, Err(RingError::Corrupt(_))),
            "past the arena's end"
        );
    }

    /// A ring holding `bytes`, published.
    async fn ring_of(bytes: &[u8]) -> (RingWriter, RingReader) {
        let (mut writer, reader, _, _) = crate::ring::in_process(1 << 16).unwrap();
        writer.write(bytes).await.unwrap();
        writer.flush();
        (writer, reader)
    }

    #[tokio::test]
    async fn a_write_resumed_after_any_word_leaves_what_a_whole_write_leaves() {
        let message = Encoded::of(push(&[13, 0, 4096, 5]));
        let whole = message.header.len().div_ceil(8)
            + [13usize, 0, 4096, 5]
                .iter()
                .map(|l| l.div_ceil(8))
                .sum::<usize>()
            + 2
            + 4;
        assert_eq!(message.ring_words(), whole as u64, "as counted before");
        let reference =
            words_written(whole, async |ring| message.write_from(ring, 3, 0).await).await;
        for cut in 0..=whole {
            let resumed = words_written(whole, async |ring| {
                ring.write(&reference[..cut * 8]).await?;
                message.write_from(ring, 3, cut as u64).await
            })
            .await;
            assert!(resumed == reference, "resumed after word {cut}");
        }
    }
}
