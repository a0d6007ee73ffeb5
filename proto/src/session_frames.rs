//! The `Session` stream's messages written as gRPC messages in pieces: the
//! large ids and rows of a row push, and a row pull's answer's rows (one
//! buffer for all its blocks), when large, are sent as the buffers they already are, behind a few bytes of
//! header, where tonic's encoder would copy every message into one buffer
//! first. Smaller fields, and every other operation, are written whole.
//!
//! The large fields are written after the small ones of the same message:
//! protobuf lets fields come in any order, so any decoder reads the message
//! prost would have written. The read side is [`crate::rope::Rope`], which
//! prost decodes from in place.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use crate::grpc_frames::{PREFIX_BYTES, message_prefix};
use crate::v1;
use crate::v1::session_answer::Outcome;
use crate::v1::session_request::Op;

/// A `bytes` field at least this long is sent as its own piece; a shorter one
/// is copied into the header around it. Each piece is sent as at least one
/// HTTP/2 data frame of its own (h2 cuts one longer than the largest frame),
/// and a frame costs both ends more than copying a few KiB: when a row pull's
/// answer carried each of its 32 blocks' 8-16 KiB of rows apart, 2x2 pulls
/// ran at 0.8x of the same answer copied into one piece (docs/benchmarks.md,
/// "Rows as frames"). A push's blocks still carry their own ids and rows.
const SHARED_FROM: usize = 64 << 10;

/// `SessionRequest.push_rows`.
const REQUEST_PUSH_ROWS: u32 = 7;
/// `PushRowsRequest.blocks`.
const PUSH_ROWS_BLOCKS: u32 = 4;
/// `RowBlock.ids`.
const ROW_BLOCK_IDS: u32 = 2;
/// `RowBlock.rows`.
const ROW_BLOCK_ROWS: u32 = 3;
/// `SessionAnswer.pull_rows`.
const ANSWER_PULL_ROWS: u32 = 7;
/// `PullRowsResponse.rows`.
const PULL_ROWS_ROWS: u32 = 2;

/// The gRPC message of `request`, in pieces: a row push's large ids and rows
/// shared.
pub fn framed_session_request(request: v1::SessionRequest) -> Vec<Bytes> {
    let mut out = SessionFrames::default();
    out.put_request(request);
    out.finish()
}

/// The gRPC message of `answer`, in pieces: a row pull's rows shared when
/// they are large.
pub fn framed_session_answer(answer: v1::SessionAnswer) -> Vec<Bytes> {
    let mut out = SessionFrames::default();
    out.put_answer(answer);
    out.finish()
}

/// The most bytes of messages written one after another into one piece.
const JOINED_AT_MOST: usize = 256 << 10;

/// Session messages written one after another as the pieces of a stream: the
/// small parts of consecutive messages go into one buffer (so the messages
/// ready at once go out in as few HTTP/2 frames as tonic's encoder would send
/// them in), and large `bytes` fields are pieces of their own.
///
/// One is kept for a stream's life: the buffer the small parts are written
/// into is taken back once the pieces cut from it have been sent and dropped,
/// so a stream of small messages writes them without allocating.
#[derive(Debug, Default)]
pub struct SessionFrames {
    head: BytesMut,
    pieces: VecDeque<Bytes>,
}

impl SessionFrames {
    /// Writes `request`: a row push's large ids and rows shared.
    pub fn put_request(&mut self, mut request: v1::SessionRequest) {
        let mut push = match request.op.take() {
            Some(Op::PushRows(push)) => push,
            other => {
                request.op = other;
                return self.put_whole(&request);
            }
        };
        let blocks: Vec<Split<v1::RowBlock>> = std::mem::take(&mut push.blocks)
            .into_iter()
            .map(|mut block| {
                let ids = std::mem::take(&mut block.ids);
                let rows = std::mem::take(&mut block.rows);
                Split::new(block, vec![(ROW_BLOCK_IDS, ids), (ROW_BLOCK_ROWS, rows)])
            })
            .collect();
        let op = Nested::new(Split::new(push, Vec::new()), PUSH_ROWS_BLOCKS, blocks);
        self.put_nested(&request, REQUEST_PUSH_ROWS, op);
    }

    /// Writes `answer`: a row pull's rows shared when they are large.
    pub fn put_answer(&mut self, mut answer: v1::SessionAnswer) {
        let mut pulled = match answer.outcome.take() {
            Some(Outcome::PullRows(pulled)) => pulled,
            other => {
                answer.outcome = other;
                return self.put_whole(&answer);
            }
        };
        let rows = std::mem::take(&mut pulled.rows);
        let outcome = Split::new(pulled, vec![(PULL_ROWS_ROWS, rows)]);
        self.put_nested(&answer, ANSWER_PULL_ROWS, outcome);
    }

    /// The pieces written, in order.
    pub fn finish(mut self) -> Vec<Bytes> {
        self.flush();
        self.pieces.into()
    }

    /// Ends the piece being written: what has been written since the last
    /// flush is all in [`SessionFrames::next_piece`]'s pieces.
    pub fn flush(&mut self) {
        if !self.head.is_empty() {
            self.pieces.push_back(self.head.split().freeze());
        }
    }

    /// The first piece flushed and not yet taken.
    pub fn next_piece(&mut self) -> Option<Bytes> {
        self.pieces.pop_front()
    }

    /// `message`, whole.
    fn put_whole(&mut self, message: &impl Message) {
        let len = message.encoded_len();
        self.make_room(PREFIX_BYTES + len);
        self.head.put_slice(&message_prefix(len));
        message.encode(&mut self.head).expect("room was made");
    }

    /// `outer` (its large field left out) with `inner` written last as field
    /// `tag`.
    fn put_nested(&mut self, outer: &impl Message, tag: u32, inner: impl Written) {
        let inner_len = inner.len();
        let message_len = outer.encoded_len() + delimited_len(tag, inner_len);
        self.make_room(PREFIX_BYTES + message_len - inner.shared_len());
        self.head.put_slice(&message_prefix(message_len));
        outer.encode(&mut self.head).expect("room was made");
        self.put_delimiter(tag, inner_len);
        inner.write(self);
    }

    /// Room for `copied` more bytes in the head, which is sent as a piece
    /// first when it would pass [`JOINED_AT_MOST`].
    fn make_room(&mut self, copied: usize) {
        if self.head.len() + copied > JOINED_AT_MOST {
            self.flush();
        }
        self.head.reserve(copied);
    }

    /// The key and length of a length-delimited field of `len` bytes.
    fn put_delimiter(&mut self, tag: u32, len: usize) {
        encode_key(tag, WireType::LengthDelimited, &mut self.head);
        encode_varint(len as u64, &mut self.head);
    }

    /// `bytes` as field `tag`: shared as its own piece when it is large.
    fn put_bytes(&mut self, tag: u32, bytes: Bytes) {
        self.put_delimiter(tag, bytes.len());
        if bytes.len() < SHARED_FROM {
            self.head.put_slice(&bytes);
            return;
        }
        self.flush();
        self.pieces.push_back(bytes);
    }
}

/// A message written partly in place and partly as pieces of its own.
trait Written {
    /// Encoded bytes of the whole message.
    fn len(&self) -> usize;
    /// Bytes of its fields that are sent as pieces of their own.
    fn shared_len(&self) -> usize;
    /// Writes it at the end of `out`.
    fn write(self, out: &mut SessionFrames);
}

/// A message as its small fields (encoded by prost) and its large `bytes`
/// fields, written after them.
struct Split<M> {
    small: M,
    large: Vec<(u32, Bytes)>,
}

impl<M: Message> Split<M> {
    fn new(small: M, large: Vec<(u32, Bytes)>) -> Self {
        Self { small, large }
    }
}

impl<M: Message> Written for Split<M> {
    fn len(&self) -> usize {
        let large: usize = self
            .large
            .iter()
            .map(|(tag, bytes)| delimited_len(*tag, bytes.len()))
            .sum();
        self.small.encoded_len() + large
    }

    fn shared_len(&self) -> usize {
        let shared = self.large.iter().map(|(_, bytes)| bytes.len());
        shared.filter(|len| *len >= SHARED_FROM).sum()
    }

    fn write(self, out: &mut SessionFrames) {
        self.small.encode(&mut out.head).expect("BytesMut grows");
        for (tag, bytes) in self.large {
            out.put_bytes(tag, bytes);
        }
    }
}

/// A message whose repeated message field `tag` holds the `items` (written
/// after its other fields).
struct Nested<M, B> {
    outer: Split<M>,
    tag: u32,
    items: Vec<Split<B>>,
}

impl<M: Message, B: Message> Nested<M, B> {
    fn new(outer: Split<M>, tag: u32, items: Vec<Split<B>>) -> Self {
        Self { outer, tag, items }
    }
}

impl<M: Message, B: Message> Written for Nested<M, B> {
    fn len(&self) -> usize {
        let items: usize = self
            .items
            .iter()
            .map(|item| delimited_len(self.tag, item.len()))
            .sum();
        self.outer.len() + items
    }

    fn shared_len(&self) -> usize {
        self.outer.shared_len() + self.items.iter().map(Split::shared_len).sum::<usize>()
    }

    fn write(self, out: &mut SessionFrames) {
        self.outer.write(out);
        for item in self.items {
            out.put_delimiter(self.tag, item.len());
            item.write(out);
        }
    }
}

/// Bytes of a length-delimited field of `len` bytes.
fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc_frames::MessageReader;
    use proptest::prelude::*;

    /// `pieces` read back as one message, decoded from the frames in place.
    fn read_back<M: Message + Default>(pieces: Vec<Bytes>) -> M {
        let mut reader = MessageReader::new(usize::MAX);
        for piece in pieces {
            reader.push(piece);
        }
        let message = reader.next_message().unwrap().expect("one whole message");
        assert_eq!(reader.finish(), Ok(()));
        M::decode(message).expect("decodes")
    }

    fn bytes_of(len: usize, seed: u8) -> Bytes {
        (0..len).map(|i| (i as u8).wrapping_add(seed)).collect()
    }

    proptest! {
        #[test]
        fn a_row_pull_answer_decodes_as_prost_writes_it(
            id in any::<u64>(),
            waited in any::<u64>(),
            blocks in proptest::collection::vec((any::<u32>(), any::<u64>()), 0..40),
            rows in 0usize..150_000,
        ) {
            let answer = v1::SessionAnswer {
                id,
                outcome: Some(Outcome::PullRows(v1::PullRowsResponse {
                    blocks: blocks
                        .iter()
                        .map(|&(bucket, version)| v1::PulledRows { bucket, version })
                        .collect(),
                    rows: bytes_of(rows, 3),
                })),
                pull_waited_us: waited,
            };
            let pieces = framed_session_answer(answer.clone());
            prop_assert_eq!(read_back::<v1::SessionAnswer>(pieces), answer);
        }

        #[test]
        fn a_row_push_decodes_as_prost_writes_it(
            id in any::<u64>(),
            step in any::<u64>(),
            table in "[a-z]{0,12}",
            blocks in proptest::collection::vec((any::<u32>(), 0usize..70_000, 0usize..90_000), 0..4),
        ) {
            let request = v1::SessionRequest {
                id,
                deadline_ms: 3,
                op: Some(Op::PushRows(v1::PushRowsRequest {
                    table,
                    worker_id: 2,
                    step,
                    blocks: blocks
                        .iter()
                        .map(|&(bucket, ids, rows)| v1::RowBlock {
                            bucket,
                            ids: bytes_of(ids, 1),
                            rows: bytes_of(rows, 2),
                        })
                        .collect(),
                    map_version: 9,
                })),
            };
            let pieces = framed_session_request(request.clone());
            prop_assert_eq!(read_back::<v1::SessionRequest>(pieces), request);
        }
    }

    #[test]
    fn large_rows_are_sent_as_they_are_and_come_out_as_they_arrived() {
        let rows = bytes_of(256 << 10, 5);
        let answer = v1::SessionAnswer {
            id: 1,
            outcome: Some(Outcome::PullRows(v1::PullRowsResponse {
                blocks: vec![v1::PulledRows {
                    bucket: 3,
                    version: 4,
                }],
                rows: rows.clone(),
            })),
            pull_waited_us: 0,
        };
        let pieces = framed_session_answer(answer);
        assert_eq!(pieces.len(), 2, "a header, then the rows");
        assert!(pieces[0].len() < 64, "the header alone is copied");
        assert_eq!(pieces[1].as_ptr(), rows.as_ptr(), "the rows are not copied");
        let decoded: v1::SessionAnswer = read_back(pieces);
        let Some(Outcome::PullRows(pulled)) = decoded.outcome else {
            panic!("a row pull's answer");
        };
        assert_eq!(
            pulled.rows.as_ptr(),
            rows.as_ptr(),
            "decoded as a slice of the frame it arrived in"
        );
    }

    #[test]
    fn messages_written_together_share_a_piece_and_large_rows_keep_theirs() {
        let small = |id| v1::SessionAnswer {
            id,
            outcome: Some(Outcome::PushRows(v1::PushRowsResponse::default())),
            pull_waited_us: 0,
        };
        let rows = bytes_of(SHARED_FROM, 2);
        let large = v1::SessionAnswer {
            id: 3,
            outcome: Some(Outcome::PullRows(v1::PullRowsResponse {
                blocks: Vec::new(),
                rows: rows.clone(),
            })),
            pull_waited_us: 0,
        };
        let mut out = SessionFrames::default();
        for answer in [small(1), small(2), large.clone(), small(4)] {
            out.put_answer(answer);
        }
        let pieces = out.finish();
        assert_eq!(
            pieces.len(),
            3,
            "two small answers and a header, the rows, the last answer"
        );
        assert_eq!(
            pieces[1].as_ptr(),
            rows.as_ptr(),
            "the large rows are not copied"
        );
        let mut reader = MessageReader::new(usize::MAX);
        for piece in pieces {
            reader.push(piece);
        }
        let mut ids = Vec::new();
        while let Some(message) = reader.next_message().unwrap() {
            ids.push(v1::SessionAnswer::decode(message).unwrap().id);
        }
        assert_eq!(ids, [1, 2, 3, 4]);

        let mut out = SessionFrames::default();
        for _ in 0..8 {
            out.put_answer(v1::SessionAnswer {
                id: 5,
                outcome: Some(Outcome::PullRows(v1::PullRowsResponse {
                    blocks: Vec::new(),
                    rows: bytes_of(40 << 10, 1),
                })),
                pull_waited_us: 0,
            });
        }
        let pieces = out.finish();
        assert_eq!(
            pieces.len(),
            2,
            "a piece stays within {JOINED_AT_MOST} bytes"
        );
        assert!(pieces.iter().all(|p| p.len() <= JOINED_AT_MOST));
    }

    #[test]
    fn other_messages_are_framed_whole() {
        let answer = v1::SessionAnswer {
            id: 7,
            outcome: Some(Outcome::PushRows(v1::PushRowsResponse::default())),
            pull_waited_us: 0,
        };
        let pieces = framed_session_answer(answer.clone());
        assert_eq!(pieces.len(), 1);
        assert_eq!(read_back::<v1::SessionAnswer>(pieces), answer);
        let request = v1::SessionRequest {
            id: 8,
            deadline_ms: 0,
            op: Some(Op::Pull(v1::PullRequest::default())),
        };
        let pieces = framed_session_request(request.clone());
        assert_eq!(pieces.len(), 1);
        assert_eq!(read_back::<v1::SessionRequest>(pieces), request);
    }
}
