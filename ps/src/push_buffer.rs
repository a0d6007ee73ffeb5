//! [`PushBuffer`]: how many bytes of push streams a server reads ahead of
//! applying them, so that its memory stays bounded however many pushes are in
//! flight.
//!
//! A push stream is applied only once all of it has arrived (a push is all or
//! nothing), so every byte of it is held until then. Eight workers pushing a
//! 16 MiB key each held 128 MiB of gradients beside 16 MiB of values. Now a
//! client declares a stream's bytes in its `ps-push-bytes` header, and the
//! server reserves that much room here before it reads the first message; a
//! stream that finds no room waits, unread.
//!
//! Waiting cannot stall the stream that holds the room: HTTP/2 lets each
//! waiting stream send at most one stream window before it must wait too, and
//! the server allows at most `connection window / stream window - 1` streams
//! per connection ([`ps_proto::transport::TransportConfig::max_streams`]), so
//! the streams that wait never fill the connection window the holder needs.
//!
//! A stream declaring more than the whole buffer waits until it has the buffer
//! to itself, so any push the memory budget allows still goes through. A
//! stream without the header (a client of another language) reserves nothing
//! and is bounded by the memory budget alone, as before.
//!
//! So a server holds, for push streams, this buffer plus one stream window per
//! stream that waits. Both defaults are sized for that sum: with 16 MiB here and
//! 2 MiB stream windows, two workers with eight 8 MiB pushes each in flight
//! keep a server at 66-71 MiB for 8 MiB of values, within the rule of 1.1 × the
//! bytes held plus 64 MiB, where 32 MiB and 4 MiB windows took 104-109 MiB; and
//! neither measurably cost throughput (docs/benchmarks.md, "Push memory").

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The room is counted in units of this many bytes, so that a reservation of up
/// to 4 TiB fits a semaphore's `u32` permit count.
const UNIT: usize = 1 << 10;

/// The push-stream bytes a server reads ahead of applying them, by default.
pub const DEFAULT_PUSH_BUFFER_BYTES: usize = 16 << 20;

/// Room for the bytes of push streams being read, shared by every connection.
#[derive(Debug, Clone)]
pub struct PushBuffer {
    room: Arc<Semaphore>,
    units: u32,
}

/// One stream's share of a [`PushBuffer`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
    /// The bytes the stream declared it would send.
    pub declared: usize,
}

impl PushBuffer {
    /// A buffer of `bytes` (at least one unit).
    pub fn new(bytes: usize) -> Self {
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .max(1);
        Self {
            room: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// The buffer's size in bytes.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.units as usize * UNIT
    }

    /// Bytes not reserved now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.room.available_permits() * UNIT
    }

    /// Waits for room for a stream of `declared` bytes (the whole buffer when it
    /// declares more), first come first served.
    pub async fn reserve(&self, declared: usize) -> Reservation {
        let wanted = u32::try_from(declared.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.units);
        let permit = Arc::clone(&self.room)
            .acquire_many_owned(wanted)
            .await
            .expect("the push buffer's semaphore is never closed");
        Reservation {
            _permit: permit,
            declared,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_stream_waits_for_room_and_gets_it_when_the_holder_is_done() {
        let buffer = PushBuffer::new(32 << 20);
        let first = buffer.reserve(20 << 20).await;
        assert_eq!(buffer.free(), 12 << 20);
        let second = tokio::spawn({
            let buffer = buffer.clone();
            async move { buffer.reserve(16 << 20).await.declared }
        });
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "16 MiB fit in 12 MiB of room");
        drop(first);
        let declared = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the second stream got its room once the first gave it back")
            .expect("the task ran");
        assert_eq!(declared, 16 << 20);
        assert_eq!(buffer.free(), buffer.capacity());
    }

    #[tokio::test]
    async fn a_stream_larger_than_the_buffer_takes_all_of_it_and_still_goes() {
        let buffer = PushBuffer::new(8 << 20);
        let huge = buffer.reserve(1 << 40).await;
        assert_eq!(huge.declared, 1 << 40);
        assert_eq!(buffer.free(), 0);
        drop(huge);
        let empty = buffer.reserve(0).await;
        assert_eq!(buffer.free(), buffer.capacity() - UNIT);
        drop(empty);
    }
}
