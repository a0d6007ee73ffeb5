//! The raw TCP baseline: the same bytes over a plain tokio TCP connection, framed as
//! `[op: u8][len: u64 LE][len bytes]`, so every gRPC figure has a ceiling to be read
//! against. The server reads into one reused buffer.
//!
//! Ops: `ECHO` sends the bytes back; `SINK` answers an 8-byte acknowledgement;
//! `STREAM` answers nothing (pipelined), and `FLUSH` answers the bytes received
//! since the last `FLUSH`. Both sides buffer small frames, as real peers would.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const ECHO: u8 = 1;
const SINK: u8 = 2;
const STREAM: u8 = 3;
const FLUSH: u8 = 4;

/// Serves the baseline protocol on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(async move {
                    if let Err(error) = serve_connection(stream).await {
                        tracing::debug!(%error, "tcp baseline connection ended");
                    }
                });
            }
            Err(error) => tracing::warn!(%error, "tcp baseline accept failed"),
        }
    }
}

async fn serve_connection(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (read, mut write) = stream.split();
    let mut read = BufReader::with_capacity(STREAM_BATCH_BYTES, read);
    let mut buffer = Vec::new();
    let mut streamed = 0u64;
    loop {
        let mut header = [0u8; 9];
        match read.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u64::from_le_bytes(header[1..9].try_into().expect("8 bytes")) as usize;
        if buffer.len() < len {
            buffer.resize(len, 0);
        }
        read.read_exact(&mut buffer[..len]).await?;
        match header[0] {
            ECHO => write.write_all(&buffer[..len]).await?,
            SINK => write.write_all(&(len as u64).to_le_bytes()).await?,
            STREAM => streamed += len as u64,
            FLUSH => {
                write
                    .write_all(&std::mem::take(&mut streamed).to_le_bytes())
                    .await?
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown op {other}"),
                ));
            }
        }
    }
}

/// Pipelined (`STREAM`) messages are gathered into writes of about this size, as a
/// buffered writer would, so small messages are not one syscall each.
const STREAM_BATCH_BYTES: usize = 256 << 10;

/// A client connection to the baseline server.
pub struct TcpPeer {
    stream: TcpStream,
    buffer: Vec<u8>,
    pending: Vec<u8>,
}

impl TcpPeer {
    /// Connects to `addr`.
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn connect(addr: &str) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buffer: Vec::new(),
            pending: Vec::new(),
        })
    }

    async fn send(&mut self, op: u8, data: &[u8]) -> io::Result<()> {
        let mut header = [0u8; 9];
        header[0] = op;
        header[1..].copy_from_slice(&(data.len() as u64).to_le_bytes());
        self.stream.write_all(&header).await?;
        self.stream.write_all(data).await
    }

    async fn read_ack(&mut self) -> io::Result<u64> {
        let mut ack = [0u8; 8];
        self.stream.read_exact(&mut ack).await?;
        Ok(u64::from_le_bytes(ack))
    }

    /// Sends `data` and waits for it to come back.
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn echo(&mut self, data: &[u8]) -> io::Result<()> {
        self.send(ECHO, data).await?;
        if self.buffer.len() < data.len() {
            self.buffer.resize(data.len(), 0);
        }
        self.stream
            .read_exact(&mut self.buffer[..data.len()])
            .await?;
        Ok(())
    }

    /// Sends `data` and waits for the acknowledgement.
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn sink(&mut self, data: &[u8]) -> io::Result<u64> {
        self.send(SINK, data).await?;
        self.read_ack().await
    }

    /// Sends `data` without waiting for the server (small messages are batched into
    /// larger writes).
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn stream(&mut self, data: &[u8]) -> io::Result<()> {
        if data.len() >= STREAM_BATCH_BYTES {
            self.write_pending().await?;
            return self.send(STREAM, data).await;
        }
        self.pending.push(STREAM);
        self.pending
            .extend_from_slice(&(data.len() as u64).to_le_bytes());
        self.pending.extend_from_slice(data);
        if self.pending.len() >= STREAM_BATCH_BYTES {
            self.write_pending().await?;
        }
        Ok(())
    }

    async fn write_pending(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.stream.write_all(&self.pending).await?;
            self.pending.clear();
        }
        Ok(())
    }

    /// Waits until the server has read everything streamed; returns its byte count.
    ///
    /// # Errors
    /// When the connection fails.
    pub async fn flush(&mut self) -> io::Result<u64> {
        self.write_pending().await?;
        self.send(FLUSH, &[]).await?;
        self.read_ack().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_op_round_trips() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(serve(listener));
        let mut peer = TcpPeer::connect(&addr).await.unwrap();
        peer.echo(b"hello").await.unwrap();
        assert_eq!(&peer.buffer[..5], b"hello");
        assert_eq!(peer.sink(&[0; 1000]).await.unwrap(), 1000);
        peer.stream(&[1; 300]).await.unwrap();
        peer.stream(&[2; 700]).await.unwrap();
        assert_eq!(peer.flush().await.unwrap(), 1000);
        assert_eq!(peer.flush().await.unwrap(), 0);
        server.abort();
    }
}
