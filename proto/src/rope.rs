//! [`Rope`]: bytes received in several [`Bytes`] pieces (HTTP/2 data frames),
//! read and split without joining them, so a large field can be taken out of a
//! message as the very buffers it arrived in.
//!
//! A rope is also a [`Buf`], so prost decodes a message straight out of it: a
//! `bytes` field that lies within one piece comes out as a slice of that piece.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};

/// A sequence of byte pieces read front to back as one byte string.
#[derive(Debug, Default, Clone)]
pub struct Rope {
    pieces: Pieces,
    len: usize,
}

impl Rope {
    /// An empty rope.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes left to read.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `piece` at the end.
    pub fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.len += piece.len();
            self.pieces.push_back(piece);
        }
    }

    /// The first `N` bytes, left in place; `None` when fewer are left.
    pub fn peek<const N: usize>(&self) -> Option<[u8; N]> {
        if self.len < N {
            return None;
        }
        let mut out = [0u8; N];
        let mut filled = 0;
        for piece in self.pieces.iter() {
            let n = piece.len().min(N - filled);
            out[filled..filled + n].copy_from_slice(&piece[..n]);
            filled += n;
            if filled == N {
                break;
            }
        }
        Some(out)
    }

    /// Reads one byte.
    pub fn read_u8(&mut self) -> Option<u8> {
        let front = self.pieces.front_mut()?;
        let byte = front.get_u8();
        if front.is_empty() {
            self.pieces.pop_front();
        }
        self.len -= 1;
        Some(byte)
    }

    /// Skips `n` bytes; `false` (and nothing skipped) when fewer are left.
    pub fn skip(&mut self, mut n: usize) -> bool {
        if n > self.len {
            return false;
        }
        self.len -= n;
        while n > 0 {
            let Some(front) = self.pieces.front_mut() else {
                break;
            };
            if front.len() > n {
                front.advance(n);
                break;
            }
            n -= front.len();
            self.pieces.pop_front();
        }
        true
    }

    /// Appends the next `n` bytes to `out`; `false` (and nothing read) when
    /// fewer are left.
    pub fn copy_to(&mut self, n: usize, out: &mut Vec<u8>) -> bool {
        let Some(taken) = self.split_to(n) else {
            return false;
        };
        for piece in taken.pieces.iter() {
            out.extend_from_slice(piece);
        }
        true
    }

    /// The next `n` bytes as a rope of their own, sharing the pieces (no copy);
    /// `None` (and nothing read) when fewer are left.
    pub fn split_to(&mut self, n: usize) -> Option<Rope> {
        if n > self.len {
            return None;
        }
        let mut taken = Rope::new();
        while taken.len < n {
            let Some(mut front) = self.pieces.pop_front() else {
                break;
            };
            let wanted = n - taken.len;
            if front.len() > wanted {
                let head = front.split_to(wanted);
                self.pieces.push_front(front);
                taken.push(head);
            } else {
                taken.push(front);
            }
        }
        self.len -= n;
        Some(taken)
    }

    /// The pieces, in order.
    pub fn into_pieces(self) -> Vec<Bytes> {
        self.pieces.into_vec()
    }

    /// The whole byte string as one buffer: the piece itself when there is
    /// one (as for a message that came in one frame), else the pieces joined.
    pub fn into_bytes(mut self) -> Bytes {
        match self.pieces.len() {
            1 => self.pieces.pop_front().unwrap_or_default(),
            _ => Bytes::from(self.into_pieces().concat()),
        }
    }
}

/// A rope's pieces, the first held apart: a rope of one piece (a message
/// that came in one frame) is made without allocating.
#[derive(Debug, Default, Clone)]
struct Pieces {
    /// `None` only when there are no pieces at all.
    first: Option<Bytes>,
    rest: VecDeque<Bytes>,
}

impl Pieces {
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    fn front(&self) -> Option<&Bytes> {
        self.first.as_ref()
    }

    fn front_mut(&mut self) -> Option<&mut Bytes> {
        self.first.as_mut()
    }

    fn pop_front(&mut self) -> Option<Bytes> {
        let front = self.first.take();
        self.first = self.rest.pop_front();
        front
    }

    fn push_front(&mut self, piece: Bytes) {
        if let Some(front) = self.first.replace(piece) {
            self.rest.push_front(front);
        }
    }

    fn push_back(&mut self, piece: Bytes) {
        match self.first {
            None => self.first = Some(piece),
            Some(_) => self.rest.push_back(piece),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Bytes> {
        self.first.iter().chain(&self.rest)
    }

    fn into_vec(self) -> Vec<Bytes> {
        self.first.into_iter().chain(self.rest).collect()
    }
}

impl From<Bytes> for Rope {
    fn from(piece: Bytes) -> Self {
        let mut rope = Rope::new();
        rope.push(piece);
        rope
    }
}

impl Buf for Rope {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.pieces.front().map_or(&[], |piece| &piece[..])
    }

    fn advance(&mut self, cnt: usize) {
        assert!(
            self.skip(cnt),
            "advanced {cnt} bytes past a rope of {}",
            self.len
        );
    }

    /// The next `len` bytes: a slice of the front piece when they lie within
    /// it, else the pieces they span joined.
    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        if let Some(front) = self.pieces.front_mut().filter(|f| f.len() >= len) {
            let taken = front.split_to(len);
            if front.is_empty() {
                self.pieces.pop_front();
            }
            self.len -= len;
            return taken;
        }
        let taken = self
            .split_to(len)
            .unwrap_or_else(|| panic!("took {len} bytes out of a rope of {}", self.len));
        taken.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rope_of(pieces: &[&'static [u8]]) -> Rope {
        let mut rope = Rope::new();
        for piece in pieces {
            rope.push(Bytes::from_static(piece));
        }
        rope
    }

    fn joined(rope: Rope) -> Vec<u8> {
        rope.into_pieces().concat()
    }

    #[test]
    fn splits_across_pieces_without_copying_them() {
        let first = Bytes::from_static(b"abcd");
        let mut rope = Rope::from(first.clone());
        rope.push(Bytes::from_static(b"efgh"));
        let head = rope.split_to(6).expect("six bytes are there");
        let pieces = head.into_pieces();
        assert_eq!(pieces.len(), 2);
        assert_eq!(
            pieces[0].as_ptr(),
            first.as_ptr(),
            "the first piece is shared"
        );
        assert_eq!(pieces.concat(), b"abcdef");
        assert_eq!(joined(rope), b"gh");
    }

    #[test]
    fn a_rope_of_one_piece_is_that_piece_and_of_several_is_them_joined() {
        let piece = Bytes::from_static(b"abcd");
        let whole = Rope::from(piece.clone()).into_bytes();
        assert_eq!(whole.as_ptr(), piece.as_ptr(), "one piece is not copied");
        assert_eq!(rope_of(&[b"ab", b"c", b"de"]).into_bytes(), &b"abcde"[..]);
        assert!(Rope::new().into_bytes().is_empty());
    }

    #[test]
    fn reading_past_the_end_takes_nothing() {
        let mut rope = rope_of(&[b"ab", b"c"]);
        assert!(rope.split_to(4).is_none());
        assert_eq!(rope.peek::<4>(), None);
        let mut out = Vec::new();
        assert!(!rope.copy_to(4, &mut out));
        assert!(out.is_empty());
        assert_eq!(rope.len(), 3);
        assert_eq!(rope.peek::<3>(), Some(*b"abc"));
        assert_eq!(rope.read_u8(), Some(b'a'));
        assert!(rope.skip(1));
        assert!(rope.copy_to(1, &mut out));
        assert_eq!(out, b"c");
        assert!(rope.is_empty());
        assert_eq!(rope.read_u8(), None);
    }

    #[test]
    fn a_field_within_one_piece_is_taken_as_a_slice_of_it() {
        let first = Bytes::from_static(b"abcdef");
        let mut rope = Rope::from(first.clone());
        rope.push(Bytes::from_static(b"gh"));
        rope.advance(1);
        assert_eq!(rope.chunk(), b"bcdef");
        let field = rope.copy_to_bytes(3);
        assert_eq!(field, &b"bcd"[..]);
        assert_eq!(field.as_ptr(), first[1..].as_ptr(), "not copied");
        assert_eq!(rope.copy_to_bytes(3), &b"efg"[..], "joined across pieces");
        assert_eq!(rope.remaining(), 1);
        assert_eq!(rope.chunk(), b"h");
    }

    proptest! {
        #[test]
        fn reads_as_the_joined_bytes_however_they_are_cut(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            reads in proptest::collection::vec(0usize..40, 0..12),
        ) {
            let whole = Bytes::from(bytes);
            let mut at: Vec<usize> = cuts.iter().map(|c| c % (whole.len() + 1)).collect();
            at.extend([0, whole.len()]);
            at.sort_unstable();
            let mut rope = Rope::new();
            for pair in at.windows(2) {
                rope.push(whole.slice(pair[0]..pair[1]));
            }
            let mut read = Vec::new();
            for n in reads {
                let n = n.min(rope.remaining());
                prop_assert!(rope.chunk().len() <= rope.remaining());
                read.extend_from_slice(&rope.copy_to_bytes(n));
            }
            read.extend_from_slice(&rope.copy_to_bytes(rope.remaining()));
            prop_assert_eq!(&read[..], &whole[..]);
            prop_assert_eq!(rope.remaining(), 0);
        }
    }
}
