//! The reference the TCP baseline is checked against (`ps-microbench tcp-check`): the
//! plainest send-and-ack loop, as anyone would write it, sharing no code with
//! [`crate::tcp`]. Each message is its length (8 bytes) and then its bytes, each
//! written with one `write_all`; the server reads it whole and answers 8 bytes. One
//! blocking thread per side, one reused buffer each.
//!
//! (The length goes first for a measured reason, not only for framing: on Linux
//! loopback a 1 MiB message that follows a small write is acknowledged about twice
//! as fast as one sent alone, since the small segment wakes the reader, which is
//! then already in `recv` as the bulk arrives. A loop without it is not "plain",
//! it is slow; see docs/benchmarks.md.)

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A server for one connection, on a thread of its own.
pub struct PlainServer {
    addr: SocketAddr,
    thread: JoinHandle<io::Result<()>>,
}

impl PlainServer {
    /// Listens on a loopback port and serves the first connection.
    ///
    /// # Errors
    /// When nothing can listen.
    pub fn start() -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let thread = std::thread::spawn(move || {
            let (stream, _) = listener.accept()?;
            acknowledge_each(stream)
        });
        Ok(Self { addr, thread })
    }

    /// Connects a client that sends messages of `size` bytes.
    ///
    /// # Errors
    /// When the connection fails.
    pub fn client(&self, size: usize) -> io::Result<PlainClient> {
        let stream = TcpStream::connect(self.addr)?;
        stream.set_nodelay(true)?;
        Ok(PlainClient {
            stream,
            message: vec![0x5a; size],
        })
    }

    /// Waits for the server's thread after its client has gone.
    ///
    /// # Errors
    /// What the server's connection ended with.
    pub fn join(self) -> io::Result<()> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the plain server panicked")))
    }
}

/// The largest message the plain server takes.
const LARGEST: u64 = 1 << 30;

fn acknowledge_each(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut message = Vec::new();
    loop {
        let mut length = [0u8; 8];
        match stream.read_exact(&mut length) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let length = u64::from_le_bytes(length);
        if length > LARGEST {
            return Err(io::Error::other(format!("a {length}-byte message")));
        }
        message.resize(length as usize, 0);
        stream.read_exact(&mut message)?;
        stream.write_all(&length.to_le_bytes())?;
    }
}

/// The client side: one message out, one acknowledgement back.
pub struct PlainClient {
    stream: TcpStream,
    message: Vec<u8>,
}

impl PlainClient {
    /// Sends one message and waits for its acknowledgement.
    ///
    /// # Errors
    /// When the connection fails.
    pub fn send_and_ack(&mut self) -> io::Result<u64> {
        self.stream
            .write_all(&(self.message.len() as u64).to_le_bytes())?;
        self.stream.write_all(&self.message)?;
        let mut ack = [0u8; 8];
        self.stream.read_exact(&mut ack)?;
        Ok(u64::from_le_bytes(ack))
    }

    /// Sends and waits in a loop for `length`; returns the bytes acknowledged and the
    /// messages sent.
    ///
    /// # Errors
    /// When the connection fails.
    pub fn run_for(&mut self, length: Duration) -> io::Result<(u64, u64)> {
        let until = Instant::now() + length;
        let (mut bytes, mut messages) = (0, 0);
        while Instant::now() < until {
            bytes += self.send_and_ack()?;
            messages += 1;
        }
        Ok((bytes, messages))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_is_acknowledged_with_its_size() {
        let server = PlainServer::start().unwrap();
        let mut client = server.client(1000).unwrap();
        assert_eq!(client.send_and_ack().unwrap(), 1000);
        assert_eq!(client.send_and_ack().unwrap(), 1000);
        drop(client);
        server.join().unwrap();
    }
}
