//! gRPC's length-prefixed messages read out of HTTP/2 data frames without
//! joining the frames ([`MessageReader`]), and the prefix written in front of a
//! message that is sent as several pieces ([`message_prefix`]).
//!
//! Each gRPC message on an HTTP/2 stream is a one-byte compression flag, a
//! four-byte big-endian length, and that many bytes of protobuf. tonic copies
//! every data frame into one contiguous buffer before decoding; the reader here
//! keeps the frames as they arrived and cuts messages out of them, so a large
//! `bytes` field can be handed on without a copy.

use bytes::Bytes;

use tonic::{Code, Status};

use crate::rope::Rope;

/// The compression flag and length in front of every gRPC message.
pub const PREFIX_BYTES: usize = 5;

/// The content type of every gRPC request and answer.
pub const GRPC_CONTENT_TYPE: &str = "application/grpc";

/// The HTTP/2 path of `ps.v1.ParameterServer/Push`, called as frames (a small
/// push is one message; tonic serves it).
pub const PUSH_PATH: &str = "/ps.v1.ParameterServer/Push";

/// The HTTP/2 path of `ps.v1.ParameterServer/PushStream`, served and called
/// as frames.
pub const PUSH_STREAM_PATH: &str = "/ps.v1.ParameterServer/PushStream";

/// The HTTP/2 path of `ps.v1.ParameterServer/Pull`, called as frames (a small
/// pull is answered in one message; tonic serves it).
pub const PULL_PATH: &str = "/ps.v1.ParameterServer/Pull";

/// The HTTP/2 path of `ps.v1.ParameterServer/PullStream`, served and called
/// as frames.
pub const PULL_STREAM_PATH: &str = "/ps.v1.ParameterServer/PullStream";

/// The HTTP/2 path of `ps.v1.ParameterServer/Session`, served and called as
/// frames.
pub const SESSION_PATH: &str = "/ps.v1.ParameterServer/Session";

/// Why the bytes of a stream are not a sequence of gRPC messages this server
/// reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A message whose compression flag is set: candle-ps never compresses
    /// tensors, and accepts no compression.
    #[error(
        "a message arrived compressed (flag {flag}); this server accepts uncompressed messages only: turn compression off in the client"
    )]
    Compressed {
        /// The flag byte received.
        flag: u8,
    },
    /// A message longer than the limit.
    #[error(
        "Error, decoded message length too large: found {len} bytes, the limit is: {limit} bytes"
    )]
    TooLarge {
        /// The length the prefix declared.
        len: usize,
        /// The largest message taken.
        limit: usize,
    },
    /// The stream ended inside a message.
    #[error("the stream ended {left} bytes into a message whose length prefix promised more")]
    Truncated {
        /// The bytes of the unfinished message that did arrive.
        left: usize,
    },
}

impl FrameError {
    /// The status for this fault, with the codes tonic gives the same faults;
    /// `truncated` is the code for a stream that ended inside a message (the
    /// sender's fault: `INVALID_ARGUMENT` from a server, `INTERNAL` from a
    /// client, as tonic says).
    pub fn into_status(self, truncated: Code) -> Status {
        let message = self.to_string();
        match self {
            FrameError::TooLarge { .. } => Status::out_of_range(message),
            FrameError::Compressed { .. } => Status::unimplemented(message),
            FrameError::Truncated { .. } => Status::new(truncated, message),
        }
    }
}

/// Cuts gRPC messages out of the data frames of one HTTP/2 stream.
#[derive(Debug)]
pub struct MessageReader {
    received: Rope,
    limit: usize,
}

impl MessageReader {
    /// A reader that refuses messages longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            received: Rope::new(),
            limit,
        }
    }

    /// Adds the next data frame of the stream.
    pub fn push(&mut self, frame: Bytes) {
        self.received.push(frame);
    }

    /// The next whole message, as the frame pieces it arrived in; `None` until
    /// all of it has arrived.
    ///
    /// # Errors
    /// [`FrameError::Compressed`] or [`FrameError::TooLarge`] as soon as the
    /// prefix shows it, before the message's bytes arrive.
    pub fn next_message(&mut self) -> Result<Option<Rope>, FrameError> {
        let Some(prefix) = self.received.peek::<PREFIX_BYTES>() else {
            return Ok(None);
        };
        let [flag, length @ ..] = prefix;
        if flag != 0 {
            return Err(FrameError::Compressed { flag });
        }
        let len = u32::from_be_bytes(length) as usize;
        if len > self.limit {
            return Err(FrameError::TooLarge {
                len,
                limit: self.limit,
            });
        }
        if self.received.len() < PREFIX_BYTES + len {
            return Ok(None);
        }
        self.received.skip(PREFIX_BYTES);
        Ok(self.received.split_to(len))
    }

    /// Checks that the stream ended between messages.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] when part of a message is left.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.received.len() {
            0 => Ok(()),
            left => Err(FrameError::Truncated { left }),
        }
    }
}

/// The prefix of an uncompressed message of `len` bytes.
///
/// # Panics
/// When `len` does not fit in the prefix's 32 bits; callers keep messages
/// within the transport's message limit, far below that.
pub fn message_prefix(len: usize) -> [u8; PREFIX_BYTES] {
    let len = u32::try_from(len).expect("a gRPC message is under 4 GiB");
    let [a, b, c, d] = len.to_be_bytes();
    [0, a, b, c, d]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn framed(messages: &[Vec<u8>]) -> Vec<u8> {
        let mut wire = Vec::new();
        for message in messages {
            wire.extend(message_prefix(message.len()));
            wire.extend(message);
        }
        wire
    }

    proptest! {
        #[test]
        fn messages_come_out_whole_however_the_frames_cut_them(
            messages in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..6),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let wire = Bytes::from(framed(&messages));
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
            at.extend([0, wire.len()]);
            at.sort_unstable();
            let mut reader = MessageReader::new(1 << 20);
            let mut got = Vec::new();
            for pair in at.windows(2) {
                reader.push(wire.slice(pair[0]..pair[1]));
                while let Some(message) = reader.next_message().unwrap() {
                    got.push(message.into_pieces().concat());
                }
            }
            prop_assert_eq!(got, messages);
            prop_assert_eq!(reader.finish(), Ok(()));
        }
    }

    #[test]
    fn an_oversized_or_compressed_message_is_refused_from_its_prefix() {
        let mut reader = MessageReader::new(16);
        reader.push(Bytes::copy_from_slice(&message_prefix(17)));
        assert_eq!(
            reader.next_message().unwrap_err(),
            FrameError::TooLarge { len: 17, limit: 16 }
        );
        let mut reader = MessageReader::new(16);
        reader.push(Bytes::from_static(&[1, 0, 0, 0, 1, 9]));
        assert_eq!(
            reader.next_message().unwrap_err(),
            FrameError::Compressed { flag: 1 }
        );
    }

    #[test]
    fn a_stream_that_ends_inside_a_message_is_refused() {
        let mut reader = MessageReader::new(16);
        reader.push(Bytes::from_static(&[0, 0, 0, 0, 4, 1, 2]));
        assert!(reader.next_message().unwrap().is_none());
        assert_eq!(reader.finish(), Err(FrameError::Truncated { left: 7 }));
    }
}
