//! The floor of `rows`: a key-value server with no protocol at all. Each slot
//! sends its batches over a raw loopback TCP connection (`[op][n][ids][rows]`)
//! to a thread that looks every id up in one hash map of rows behind one lock
//! and applies Adagrad in place (a push) or copies the rows out (a pull), then
//! answers. The same batches, slots and seconds as the `rows` run it stands
//! beside: what a server that keeps rows in a hash map reaches on these cores,
//! before any framing, encoding or routing.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kv::Op;
use crate::rows::{RowsPlan, zipf_batches};

/// What the floor reached.
#[derive(Debug, Clone, Copy)]
pub struct FloorFigures {
    /// Distinct rows per second with every slot busy.
    pub rows_per_sec: f64,
    /// Median latency of one batch with one in flight, microseconds.
    pub p50_us: f64,
}

const PUSH: u8 = 1;
const PULL: u8 = 2;
const LR: f32 = 0.01;
const EPS: f32 = 1e-10;

/// Rows by id, with Adagrad's accumulators.
#[derive(Default)]
struct Rows {
    index: HashMap<u64, usize>,
    values: Vec<f32>,
    sums: Vec<f32>,
}

impl Rows {
    fn slot(&mut self, id: u64, width: usize) -> usize {
        let next = self.index.len();
        let slot = *self.index.entry(id).or_insert(next);
        if slot == next {
            self.values.resize((slot + 1) * width, 0.0);
            self.sums.resize((slot + 1) * width, 0.1);
        }
        slot
    }
}

fn serve(mut stream: TcpStream, rows: Arc<Mutex<Rows>>, width: usize) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut head = [0u8; 5];
    let (mut ids, mut data) = (Vec::new(), Vec::new());
    loop {
        if stream.read_exact(&mut head).is_err() {
            return Ok(());
        }
        let n = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        ids.resize(n * 8, 0);
        stream.read_exact(&mut ids)?;
        data.resize(n * width * 4, 0);
        let mut table = rows.lock().unwrap_or_else(|p| p.into_inner());
        if head[0] == PUSH {
            stream.read_exact(&mut data)?;
            for (id, grad) in ids.chunks_exact(8).zip(data.chunks_exact(width * 4)) {
                let id = u64::from_le_bytes(id.try_into().unwrap_or_default());
                let start = table.slot(id, width) * width;
                let Rows { values, sums, .. } = &mut *table;
                for (e, g) in grad.chunks_exact(4).enumerate() {
                    let g = f32::from_le_bytes(g.try_into().unwrap_or_default());
                    sums[start + e] += g * g;
                    values[start + e] -= LR * g / (sums[start + e].sqrt() + EPS);
                }
            }
            drop(table);
            stream.write_all(&[1])?;
        } else {
            for (id, out) in ids.chunks_exact(8).zip(data.chunks_exact_mut(width * 4)) {
                let id = u64::from_le_bytes(id.try_into().unwrap_or_default());
                if let Some(&slot) = table.index.get(&id) {
                    let row = &table.values[slot * width..(slot + 1) * width];
                    for (o, v) in out.chunks_exact_mut(4).zip(row) {
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                } else {
                    out.fill(0);
                }
            }
            drop(table);
            stream.write_all(&data)?;
        }
    }
}

/// One client connection sending batches.
struct Sender {
    stream: TcpStream,
    buffer: Vec<u8>,
    answer: Vec<u8>,
}

impl Sender {
    fn connect(addr: std::net::SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buffer: Vec::new(),
            answer: Vec::new(),
        })
    }

    fn send(&mut self, op: Op, ids: &[u64], width: usize) -> io::Result<()> {
        self.buffer.clear();
        self.buffer.push(if op == Op::Push { PUSH } else { PULL });
        self.buffer
            .extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            self.buffer.extend_from_slice(&id.to_le_bytes());
        }
        let row_bytes = ids.len() * width * 4;
        if op == Op::Push {
            let grad = 1e-3f32.to_le_bytes();
            for _ in 0..ids.len() * width {
                self.buffer.extend_from_slice(&grad);
            }
            self.stream.write_all(&self.buffer)?;
            self.answer.resize(1, 0);
        } else {
            self.stream.write_all(&self.buffer)?;
            self.answer.resize(row_bytes, 0);
        }
        self.stream.read_exact(&mut self.answer)
    }
}

/// Runs the floor for `op` with the plan's batches, slots and seconds.
///
/// # Errors
/// When the loopback connection fails.
pub fn measure_floor(plan: &RowsPlan, op: Op) -> anyhow::Result<FloorFigures> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let rows = Arc::new(Mutex::new(Rows::default()));
    let width = plan.width;
    let stop = Arc::new(AtomicBool::new(false));
    let accepting = {
        let (rows, stop) = (Arc::clone(&rows), Arc::clone(&stop));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let rows = Arc::clone(&rows);
                std::thread::spawn(move || serve(stream, rows, width));
            }
        })
    };
    let phase = Duration::from_secs_f64(plan.seconds);
    let batches = zipf_batches(plan.batch, plan.rows, plan.zipf, 32, 0);

    let mut one = Sender::connect(addr)?;
    let mut latencies = Vec::new();
    let end = Instant::now() + phase;
    for ids in batches.iter().cycle() {
        if Instant::now() >= end {
            break;
        }
        let began = Instant::now();
        one.send(op, ids, width)?;
        latencies.push(began.elapsed().as_secs_f64() * 1e6);
    }
    drop(one);

    let slots = plan.workers * plan.window;
    let end = Instant::now() + phase;
    let started = Instant::now();
    let threads: Vec<_> = (0..slots)
        .map(|slot| {
            let batches = zipf_batches(plan.batch, plan.rows, plan.zipf, 32, slot as u64 + 1);
            std::thread::spawn(move || -> io::Result<u64> {
                let mut sender = Sender::connect(addr)?;
                let mut moved = 0u64;
                for ids in batches.iter().cycle() {
                    if Instant::now() >= end {
                        break;
                    }
                    sender.send(op, ids, width)?;
                    moved += ids.len() as u64;
                }
                Ok(moved)
            })
        })
        .collect();
    let mut moved = 0;
    for thread in threads {
        moved += thread
            .join()
            .map_err(|_| anyhow::anyhow!("a floor sender panicked"))??;
    }
    let seconds = started.elapsed().as_secs_f64();
    // Wake the accept loop with a connection it drops, so it ends.
    stop.store(true, Ordering::Release);
    drop(TcpStream::connect(addr));
    let _ = accepting.join();
    Ok(FloorFigures {
        rows_per_sec: moved as f64 / seconds.max(1e-9),
        p50_us: crate::report::median(&mut latencies).unwrap_or(0.0),
    })
}
