//! The raw TCP baseline: the same bytes over plain blocking `std::net` sockets, each
//! connection on a thread of its own with one reused buffer, so that every gRPC
//! figure is read against what the kernel can do and not against a second runtime.
//! Frames are `[op: u8][7 zero bytes][len: u64 LE][len bytes]`: the 16-byte
//! header keeps every payload 16-byte aligned in the byte stream, which on this
//! machine's loopback made 1 MiB acknowledged messages 1.5x as fast as a 9-byte
//! header (the kernel's copies into and out of the socket are slower on a
//! misaligned stream; see docs/benchmarks.md).
//!
//! Ops: `ECHO` sends the bytes back; `SINK` answers an 8-byte acknowledgement;
//! `APPLY` does too, once it has applied the bytes as a little-endian `f32`
//! gradient to the connection's own values with the parameter server's SGD
//! (`ApplyingSink`); `STREAM` answers nothing (pipelined), and `FLUSH` answers
//! the bytes received since the last `FLUSH`. Small frames go out in one write,
//! and pipelined ones are gathered into larger writes, as real peers would.
//!
//! [`TcpPeer`]'s calls block: run measurement loops on a thread of their own (for
//! example `tokio::task::spawn_blocking`), never on an async runtime's workers.
//!
//! The same protocol runs over TLS ([`BaselineServer::start_tls`],
//! [`TcpPeer::connect_tls`]): rustls straight over the socket, with the cipher
//! suites of the gRPC path, is the floor that TLS itself sets on this machine.

use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use ps_proto::codec::{DType, TensorData};
use ps_server::optimizer::{Gradient, Optimizer, OptimizerSpec};
use rustls::pki_types::ServerName;
use rustls::{ClientConnection, ServerConnection, StreamOwned};

const ECHO: u8 = 1;
const SINK: u8 = 2;
const STREAM: u8 = 3;
const FLUSH: u8 = 4;
const APPLY: u8 = 5;
const HEADER_BYTES: usize = 16;

/// Pipelined (`STREAM`) messages are gathered into writes of about this size, as a
/// buffered writer would, so small messages are not one syscall each.
const STREAM_BATCH_BYTES: usize = 256 << 10;

/// The server's read buffer: enough to take many small frames per `recv`, small
/// enough that a large frame is read almost entirely straight into its buffer
/// (a larger one copies up to its size of every large frame a second time, which
/// cost a quarter of the 1 MiB rate).
const READ_BUFFER_BYTES: usize = 16 << 10;

/// Frames up to this size are copied behind their header and sent in one write.
const SINGLE_WRITE_BYTES: usize = 64 << 10;

/// The largest frame the server reads: a benchmark payload, not a memory bomb.
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// The baseline server: an accepting thread and a thread per connection. Dropping
/// it stops accepting; connections end when their clients close them.
pub struct BaselineServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl BaselineServer {
    /// Serves the baseline protocol on `listener` (blocking or not: it is made
    /// blocking here).
    ///
    /// # Errors
    /// When the listener cannot be configured.
    pub fn start(listener: TcpListener) -> io::Result<Self> {
        Self::serve(listener, None)
    }

    /// Serves the baseline protocol over TLS, presenting `config`'s certificate.
    ///
    /// # Errors
    /// When the listener cannot be configured.
    pub fn start_tls(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> io::Result<Self> {
        Self::serve(listener, Some(config))
    }

    fn serve(listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) -> io::Result<Self> {
        listener.set_nonblocking(false)?;
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let acceptor = std::thread::Builder::new()
            .name("tcp-baseline".into())
            .spawn(move || accept_loop(&listener, &stop, tls.as_ref()))?;
        Ok(Self {
            addr,
            stopping,
            acceptor: Some(acceptor),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for BaselineServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wake the blocked accept so the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    stopping: &AtomicBool,
    tls: Option<&Arc<rustls::ServerConfig>>,
) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        match stream {
            Ok(stream) => {
                let tls = tls.cloned();
                let spawned = std::thread::Builder::new()
                    .name("tcp-baseline-conn".into())
                    .spawn(move || {
                        if let Err(error) = serve_socket(stream, tls) {
                            tracing::debug!(%error, "tcp baseline connection ended");
                        }
                    });
                if let Err(error) = spawned {
                    tracing::warn!(%error, "tcp baseline cannot start a connection thread");
                }
            }
            Err(error) => tracing::warn!(%error, "tcp baseline accept failed"),
        }
    }
}

fn serve_socket(stream: TcpStream, tls: Option<Arc<rustls::ServerConfig>>) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    match tls {
        None => serve_connection(stream),
        Some(config) => {
            let session = ServerConnection::new(config).map_err(io::Error::other)?;
            serve_connection(StreamOwned::new(session, stream))
        }
    }
}

fn serve_connection(stream: impl Read + Write) -> io::Result<()> {
    let mut read = BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let mut buffer = Vec::new();
    let mut streamed = 0u64;
    let mut applying = ApplyingSink::new()?;
    loop {
        let mut header = [0u8; HEADER_BYTES];
        // With nothing buffered (after a large frame) the header is read straight
        // from the socket: a buffered read here would pull in part of the next
        // payload and copy it twice.
        let header_read = if read.buffer().is_empty() {
            read.get_mut().read_exact(&mut header)
        } else {
            read.read_exact(&mut header)
        };
        match header_read {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = frame_len(&header)?;
        if buffer.len() < len {
            buffer.resize(len, 0);
        }
        read.read_exact(&mut buffer[..len])?;
        let write = read.get_mut();
        match header[0] {
            ECHO => write.write_all(&buffer[..len])?,
            SINK => write.write_all(&(len as u64).to_le_bytes())?,
            APPLY => {
                buffer = applying.apply(std::mem::take(&mut buffer), len)?;
                write.write_all(&(len as u64).to_le_bytes())?;
            }
            STREAM => streamed += len as u64,
            FLUSH => write.write_all(&std::mem::take(&mut streamed).to_le_bytes())?,
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown op {other}"),
                ));
            }
        }
    }
}

/// What a parameter server must do with every push, and nothing else: the
/// connection's own `f32` values, updated by the server's SGD kernel (the same
/// code, split over the same cores) with each `APPLY` payload as the gradient.
struct ApplyingSink {
    values: Vec<f32>,
    optimizer: Optimizer,
}

impl ApplyingSink {
    /// SGD at a learning rate of 0.01, over no values until the first frame.
    fn new() -> io::Result<Self> {
        Ok(Self {
            values: Vec::new(),
            optimizer: Optimizer::new(Self::spec()?, 0),
        })
    }

    fn spec() -> io::Result<OptimizerSpec> {
        OptimizerSpec::from_proto(Some(&ps_client::sgd(0.01))).map_err(io::Error::other)
    }

    /// Applies the first `len` bytes of `buffer` and hands the buffer back for
    /// the next frame.
    fn apply(&mut self, buffer: Vec<u8>, len: usize) -> io::Result<Vec<u8>> {
        let elements = len / 4;
        if !len.is_multiple_of(4) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("an APPLY frame of {len} bytes is not whole f32 elements"),
            ));
        }
        if self.values.len() != elements {
            self.values = vec![0.5; elements];
            self.optimizer = Optimizer::new(Self::spec()?, elements);
        }
        let bytes = Bytes::from(buffer);
        let gradient = TensorData::new(DType::F32, vec![elements], bytes.slice(..len))
            .map_err(io::Error::other)?;
        self.optimizer
            .apply(&mut self.values, Gradient::Wire(&gradient), 1.0);
        drop(gradient);
        Ok(bytes.try_into_mut().map(Vec::from).unwrap_or_default())
    }
}

fn frame_len(header: &[u8; HEADER_BYTES]) -> io::Result<usize> {
    let len = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
    usize::try_from(len)
        .ok()
        .filter(|&len| len <= MAX_FRAME_BYTES)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {len} bytes is over the {MAX_FRAME_BYTES}-byte limit"),
            )
        })
}

/// A socket, or TLS over one.
enum PeerStream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Read for PeerStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            PeerStream::Plain(stream) => stream.read(buf),
            PeerStream::Tls(stream) => stream.read(buf),
        }
    }
}

impl Write for PeerStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            PeerStream::Plain(stream) => stream.write(buf),
            PeerStream::Tls(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            PeerStream::Plain(stream) => stream.flush(),
            PeerStream::Tls(stream) => stream.flush(),
        }
    }
}

/// A blocking client connection to the baseline server.
pub struct TcpPeer {
    stream: PeerStream,
    buffer: Vec<u8>,
    pending: Vec<u8>,
}

impl TcpPeer {
    /// Connects to `addr` (without blocking the runtime), then hands the socket to
    /// blocking calls.
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn connect(addr: &str) -> io::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?.into_std()?;
        Self::from_stream(stream)
    }

    /// Wraps a connected socket.
    ///
    /// # Errors
    /// When the socket cannot be configured.
    pub fn from_stream(stream: TcpStream) -> io::Result<Self> {
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        Ok(Self::over(PeerStream::Plain(stream)))
    }

    /// Connects to `addr` over TLS, checking the server's certificate for
    /// `server_name` against `config`'s roots; the handshake completes before this
    /// returns.
    ///
    /// # Errors
    /// When the connection or the handshake fails.
    pub async fn connect_tls(
        addr: &str,
        config: Arc<rustls::ClientConfig>,
        server_name: &str,
    ) -> io::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?.into_std()?;
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        tokio::task::spawn_blocking(move || {
            stream.set_nonblocking(false)?;
            stream.set_nodelay(true)?;
            let session = ClientConnection::new(config, name).map_err(io::Error::other)?;
            let mut tls = StreamOwned::new(session, stream);
            while tls.conn.is_handshaking() {
                tls.conn.complete_io(&mut tls.sock)?;
            }
            Ok(Self::over(PeerStream::Tls(Box::new(tls))))
        })
        .await
        .map_err(io::Error::other)?
    }

    fn over(stream: PeerStream) -> Self {
        Self {
            stream,
            buffer: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// The cipher suite a TLS connection agreed on; `None` over plain TCP.
    pub fn cipher_suite(&self) -> Option<rustls::CipherSuite> {
        match &self.stream {
            PeerStream::Plain(_) => None,
            PeerStream::Tls(tls) => tls.conn.negotiated_cipher_suite().map(|s| s.suite()),
        }
    }

    fn send(&mut self, op: u8, data: &[u8]) -> io::Result<()> {
        let header = header(op, data.len());
        if data.len() <= SINGLE_WRITE_BYTES {
            self.pending.clear();
            self.pending.extend_from_slice(&header);
            self.pending.extend_from_slice(data);
            self.stream.write_all(&self.pending)?;
            self.pending.clear();
            return Ok(());
        }
        self.stream.write_all(&header)?;
        self.stream.write_all(data)
    }

    fn read_ack(&mut self) -> io::Result<u64> {
        let mut ack = [0u8; 8];
        self.stream.read_exact(&mut ack)?;
        Ok(u64::from_le_bytes(ack))
    }

    /// Sends `data` and waits for it to come back.
    ///
    /// # Errors
    /// When the connection fails.
    pub fn echo(&mut self, data: &[u8]) -> io::Result<()> {
        self.write_pending()?;
        self.send(ECHO, data)?;
        if self.buffer.len() < data.len() {
            self.buffer.resize(data.len(), 0);
        }
        self.stream.read_exact(&mut self.buffer[..data.len()])
    }

    /// Sends `data` and waits for the acknowledgement.
    ///
    /// # Errors
    /// When the connection fails.
    pub fn sink(&mut self, data: &[u8]) -> io::Result<u64> {
        self.write_pending()?;
        self.send(SINK, data)?;
        self.read_ack()
    }

    /// Sends `data` as a gradient the server applies with SGD before it
    /// acknowledges it: the least a parameter server does with a push.
    ///
    /// # Errors
    /// When the connection fails.
    pub fn apply(&mut self, data: &[u8]) -> io::Result<u64> {
        self.write_pending()?;
        self.send(APPLY, data)?;
        self.read_ack()
    }

    /// Sends `data` without waiting for the server (small messages are batched into
    /// larger writes).
    ///
    /// # Errors
    /// When the connection fails.
    pub fn stream(&mut self, data: &[u8]) -> io::Result<()> {
        if data.len() >= STREAM_BATCH_BYTES {
            self.write_pending()?;
            return self.send(STREAM, data);
        }
        self.pending.extend_from_slice(&header(STREAM, data.len()));
        self.pending.extend_from_slice(data);
        if self.pending.len() >= STREAM_BATCH_BYTES {
            self.write_pending()?;
        }
        Ok(())
    }

    fn write_pending(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.stream.write_all(&self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }

    /// Waits until the server has read everything streamed; returns its byte count.
    ///
    /// # Errors
    /// When the connection fails.
    pub fn flush(&mut self) -> io::Result<u64> {
        self.write_pending()?;
        self.send(FLUSH, &[])?;
        self.read_ack()
    }
}

fn header(op: u8, len: usize) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[0] = op;
    header[8..].copy_from_slice(&(len as u64).to_le_bytes());
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> (BaselineServer, TcpPeer) {
        let server = BaselineServer::start(TcpListener::bind("127.0.0.1:0").unwrap()).unwrap();
        let peer = TcpPeer::from_stream(TcpStream::connect(server.addr()).unwrap()).unwrap();
        (server, peer)
    }

    #[test]
    fn every_op_round_trips() {
        let (_server, mut peer) = server();
        peer.echo(b"hello").unwrap();
        assert_eq!(&peer.buffer[..5], b"hello");
        let large = vec![7u8; SINGLE_WRITE_BYTES + 1];
        peer.echo(&large).unwrap();
        assert_eq!(&peer.buffer[..large.len()], &large[..]);
        assert_eq!(peer.sink(&[0; 1000]).unwrap(), 1000);
        peer.stream(&[1; 300]).unwrap();
        peer.stream(&[2; 700]).unwrap();
        peer.stream(&vec![3; STREAM_BATCH_BYTES]).unwrap();
        assert_eq!(peer.flush().unwrap(), 1000 + STREAM_BATCH_BYTES as u64);
        assert_eq!(peer.flush().unwrap(), 0);
    }

    #[test]
    fn an_applied_frame_is_acknowledged_after_sgd_changes_the_values() {
        let (_server, mut peer) = server();
        let gradient: Vec<u8> = [1.0f32, -2.0, 0.0]
            .iter()
            .flat_map(|g| g.to_le_bytes())
            .collect();
        assert_eq!(peer.apply(&gradient).unwrap(), 12);
        assert_eq!(peer.sink(&[0; 16]).unwrap(), 16, "the connection goes on");

        let mut sink = ApplyingSink::new().unwrap();
        let buffer = sink.apply(gradient.clone(), gradient.len()).unwrap();
        assert_eq!(buffer, gradient, "the buffer comes back for the next frame");
        assert_eq!(
            sink.values,
            [0.5 - 0.01, 0.5 + 0.02, 0.5],
            "sgd(0.01) from 0.5"
        );
        sink.apply(buffer, 4).unwrap();
        assert_eq!(
            sink.values,
            [0.49],
            "a frame of another size starts new values"
        );
    }

    #[test]
    fn an_applied_frame_of_part_of_an_element_ends_the_connection() {
        let (_server, mut peer) = server();
        assert!(
            peer.apply(&[0; 6]).is_err(),
            "6 bytes are not whole f32 elements"
        );
        let mut sink = ApplyingSink::new().unwrap();
        let refused = sink.apply(vec![0; 6], 6).unwrap_err();
        assert!(
            refused.to_string().contains("not whole f32 elements"),
            "{refused}"
        );
    }

    #[test]
    fn an_oversized_frame_ends_the_connection_without_allocating_it() {
        let (_server, mut peer) = server();
        peer.stream
            .write_all(&header(SINK, MAX_FRAME_BYTES + 1))
            .unwrap();
        let mut ack = [0u8; 8];
        let read = peer.stream.read(&mut ack);
        assert!(
            matches!(read, Ok(0)) || read.is_err(),
            "the server closed the connection: {read:?}"
        );
    }

    #[test]
    fn dropping_the_server_stops_accepting() {
        let (server, _peer) = server();
        let addr = server.addr();
        drop(server);
        assert!(
            TcpStream::connect(addr).is_err(),
            "nothing listens at {addr}"
        );
    }
}
