//! The floors `kv` reads its shared-memory rows against, measured in the same
//! run: what one core does with the bytes and nothing else. A pull through
//! shared memory is at best one copy, so its floor is a single-thread
//! `memcpy` of the key ([`memcpy_bytes_per_sec`]), and, since `kv` pulls
//! into one buffer per operation in flight, the same copy into that many
//! buffers in turn ([`memcpy_window_bytes_per_sec`]: with a window of 1 MiB
//! keys the targets no longer stay in a core's L2); a push is at best a copy
//! into a buffer and the server's SGD over it ([`copy_apply_bytes_per_sec`],
//! the same kernel the server runs, split over the same cores).
//!
//! Both floors stay on one core, where a shared-memory path cannot: its
//! bytes are written on one core and read on another. [`ring_bytes_per_sec`]
//! measures that part alone, with the data path's own ring and nothing else
//! done with the bytes. On a virtual machine it moves with where the host
//! runs the two cores at the moment, by several times, so a row is read
//! against it too.
//!
//! A small operation's latency is bound by neither: it is the round trip
//! through the rings and their doorbells, and with more servers and workers
//! than cores, by how the system shares the cores between them.
//! [`round_trip_p50_us`] measures that round trip with the run's own number
//! of servers and workers, each a thread, and nothing else done; and
//! [`round_trips_per_sec`] the rate of those round trips with a window of
//! them in flight per worker, as `kv`'s throughput phase keeps, the floor
//! its small operations per second are read against.

use std::io;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ps_proto::codec::{DType, TensorData};
use ps_server::optimizer::{Gradient, Optimizer, OptimizerSpec};
use ps_shm::ring::{RingReader, RingWriter};

/// The floors at one key size.
#[derive(Debug, Clone, Copy)]
pub struct Floors {
    /// Single-thread copies of the key, bytes per second.
    pub memcpy_bytes_per_sec: f64,
    /// Single-thread copies of the key into the run's window of buffers in
    /// turn, as a worker's pulls land, bytes per second.
    pub memcpy_window_bytes_per_sec: f64,
    /// A copy into a buffer and SGD over it, bytes per second.
    pub copy_apply_bytes_per_sec: f64,
    /// The key carried through a shared-memory ring from one thread to
    /// another, bytes per second.
    pub ring_bytes_per_sec: f64,
    /// The median round trip of the key through the rings between the run's
    /// servers and workers, one operation at a time, in microseconds.
    pub round_trip_p50_us: f64,
    /// Those round trips per second, all workers together, each keeping the
    /// run's window of them in flight.
    pub round_trips_per_sec: f64,
}

impl Floors {
    /// The floors at `size` bytes, each run for `seconds`, the round trips
    /// between `servers` and `workers` threads (`window` in flight per
    /// worker for their rate).
    ///
    /// # Errors
    /// The system refused a ring's region or doorbells, or a thread.
    pub fn measure(
        size: usize,
        seconds: f64,
        (servers, workers): (usize, usize),
        window: usize,
    ) -> io::Result<Self> {
        let phase = Duration::from_secs_f64(seconds);
        Ok(Self {
            memcpy_bytes_per_sec: memcpy_bytes_per_sec(size, phase),
            memcpy_window_bytes_per_sec: memcpy_window_bytes_per_sec(size, window, phase),
            copy_apply_bytes_per_sec: copy_apply_bytes_per_sec(size, phase),
            ring_bytes_per_sec: ring_bytes_per_sec(size, phase)?,
            round_trip_p50_us: round_trip_p50_us(size, (servers, workers), phase)?,
            round_trips_per_sec: round_trips_per_sec(size, (servers, workers), window, phase)?,
        })
    }

    /// The mean of these floors and `other`'s.
    pub fn mean_with(self, other: Self) -> Self {
        let mean = |a: f64, b: f64| (a + b) / 2.0;
        Self {
            memcpy_bytes_per_sec: mean(self.memcpy_bytes_per_sec, other.memcpy_bytes_per_sec),
            memcpy_window_bytes_per_sec: mean(
                self.memcpy_window_bytes_per_sec,
                other.memcpy_window_bytes_per_sec,
            ),
            copy_apply_bytes_per_sec: mean(
                self.copy_apply_bytes_per_sec,
                other.copy_apply_bytes_per_sec,
            ),
            ring_bytes_per_sec: mean(self.ring_bytes_per_sec, other.ring_bytes_per_sec),
            round_trip_p50_us: mean(self.round_trip_p50_us, other.round_trip_p50_us),
            round_trips_per_sec: mean(self.round_trips_per_sec, other.round_trips_per_sec),
        }
    }
}

/// Copies `size` bytes from one buffer to another (both touched first) for
/// `phase`, on this thread; bytes per second.
pub fn memcpy_bytes_per_sec(size: usize, phase: Duration) -> f64 {
    memcpy_window_bytes_per_sec(size, 1, phase)
}

/// Copies `size` bytes from one buffer into each of `window` buffers in turn
/// (all touched first) for `phase`, on this thread; bytes per second. This is
/// what a worker's pulls copy with `window` of them in flight, each into its
/// own buffer: the key's source stays in cache, its targets do only while
/// `window` of them fit.
pub fn memcpy_window_bytes_per_sec(size: usize, window: usize, phase: Duration) -> f64 {
    let source = vec![0x5au8; size];
    let mut targets = vec![vec![0u8; size]; window.max(1)];
    copy_in_turn(&source, &mut targets, phase)
}

/// Copies `source` into each of `targets` in turn for `phase`, after one
/// untimed copy into each (so that no page is first touched while timed);
/// bytes per second.
fn copy_in_turn(source: &[u8], targets: &mut [Vec<u8>], phase: Duration) -> f64 {
    for target in targets.iter_mut() {
        target.copy_from_slice(source);
    }
    let mut next = 0;
    rate(source.len(), phase, || {
        targets[next].copy_from_slice(std::hint::black_box(source));
        std::hint::black_box(&mut targets[next]);
        next = (next + 1) % targets.len();
    })
}

/// Copies a gradient of `size` bytes into a buffer and applies it to the
/// values with SGD at 0.01, for `phase`; bytes per second.
pub fn copy_apply_bytes_per_sec(size: usize, phase: Duration) -> f64 {
    let elements = (size / 4).max(1);
    let gradient: Vec<u8> = (0..elements)
        .flat_map(|i| (((i % 97) as f32 - 48.0) * 1e-6).to_le_bytes())
        .collect();
    let spec = OptimizerSpec::from_proto(Some(&ps_client::sgd(0.01))).expect("SGD is an optimizer");
    let mut optimizer = Optimizer::new(spec, elements);
    let mut values = vec![0.5f32; elements];
    let mut buffer = vec![0u8; gradient.len()];
    rate(gradient.len(), phase, || {
        buffer.copy_from_slice(&gradient);
        let bytes = Bytes::from(std::mem::take(&mut buffer));
        let data = TensorData::new(DType::F32, vec![elements], bytes.clone())
            .expect("a gradient of whole elements");
        optimizer.apply(&mut values, Gradient::Wire(&data), 1.0);
        drop(data);
        buffer = bytes.try_into_mut().map(Vec::from).unwrap_or_default();
    })
}

/// Writes `size` bytes at a time into a shared-memory ring of the servers'
/// default size ([`ps_shm::DEFAULT_RING_BYTES`]) on one thread and reads them
/// out into a buffer on another, for `phase`: what the data path's own copies
/// in and out move between two cores, with nothing else done; bytes per
/// second.
///
/// # Errors
/// As [`Floors::measure`].
pub fn ring_bytes_per_sec(size: usize, phase: Duration) -> io::Result<f64> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let on = runtime.handle();
    let (mut writer, mut reader, _, _) =
        ps_shm::ring::in_process_on(ps_shm::DEFAULT_RING_BYTES, (on, on))?;
    let source = vec![0x5au8; size];
    let writing = runtime.spawn(async move {
        loop {
            if writer.write(&source).await.is_err() {
                return;
            }
            writer.flush();
            // A write that never waits (an empty key) must still see the abort.
            tokio::task::yield_now().await;
        }
    });
    let mut target = vec![0u8; size];
    let rate = runtime.block_on(async {
        let mut once = async || reader.read(&mut target).await.map_err(io::Error::other);
        once().await?;
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < phase || runs == 0 {
            once().await?;
            runs += 1;
        }
        io::Result::Ok((runs * size as u64) as f64 / start.elapsed().as_secs_f64())
    });
    // The writer waits for room that will not come: it is dropped with
    // the runtime, and the ring with it.
    writing.abort();
    runtime.shutdown_background();
    rate
}

/// A request's ends at a worker: where it writes, where it reads the answer.
type WorkerEnds = (RingWriter, RingReader);

/// A request's ends at a server: where it reads, where it answers.
type ServerEnds = (RingReader, RingWriter);

/// Round trips through the data path's own rings and doorbells between
/// `servers` and `workers` threads for `phase`, one operation at a time
/// (see `round_trips`): the median over all workers' operations, in
/// microseconds.
///
/// # Errors
/// As [`Floors::measure`].
pub fn round_trip_p50_us(size: usize, shape: (usize, usize), phase: Duration) -> io::Result<f64> {
    let times = round_trips(size, shape, move |sessions, share| {
        time_each(sessions, share, phase)
    })?;
    let mut micros: Vec<f64> = times.into_iter().flatten().collect();
    Ok(crate::report::median(&mut micros).expect("every worker times an operation"))
}

/// The same round trips for `phase` with `window` of them in flight per
/// worker: every worker's operations per second, added up.
///
/// # Errors
/// As [`Floors::measure`].
pub fn round_trips_per_sec(
    size: usize,
    shape: (usize, usize),
    window: usize,
    phase: Duration,
) -> io::Result<f64> {
    let window = window.max(1);
    let rates = round_trips(size, shape, move |sessions, share| {
        count_windowed(sessions, share, window, phase)
    })?;
    Ok(rates.into_iter().sum())
}

/// Runs `each_worker` on each of `workers` threads against `servers`
/// threads, each with a one-thread runtime as the processes have on two
/// cores: every worker writes its share of `size` bytes (`size / servers`)
/// to every server and waits for a word back from each, as a push of a key
/// split over the servers does; each server reads the share and answers,
/// nothing else. What each worker returned.
fn round_trips<T, F, Fut>(
    size: usize,
    (servers, workers): (usize, usize),
    each_worker: F,
) -> io::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(Vec<WorkerEnds>, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, ps_shm::ring::RingError>>,
{
    if servers == 0 || workers == 0 {
        return Err(io::Error::other("a round trip needs a worker and a server"));
    }
    let share = size.div_ceil(servers).max(8);
    // Every runtime and ring is made before any thread starts, so that no
    // worker waits on a server that could not start; each side's doorbells
    // wait on its own thread's runtime.
    let one_thread = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let server_runtimes = (0..servers)
        .map(|_| one_thread())
        .collect::<io::Result<Vec<_>>>()?;
    let worker_runtimes = (0..workers)
        .map(|_| one_thread())
        .collect::<io::Result<Vec<_>>>()?;
    let mut at_servers: Vec<Vec<ServerEnds>> = (0..servers).map(|_| Vec::new()).collect();
    let mut at_workers: Vec<Vec<WorkerEnds>> = (0..workers).map(|_| Vec::new()).collect();
    for (worker, worker_runtime) in at_workers.iter_mut().zip(&worker_runtimes) {
        for (server, server_runtime) in at_servers.iter_mut().zip(&server_runtimes) {
            let (requests, requests_in, answers, answers_in) = ps_shm::ring::in_process_on(
                ps_shm::DEFAULT_RING_BYTES,
                (worker_runtime.handle(), server_runtime.handle()),
            )?;
            worker.push((requests, answers_in));
            server.push((requests_in, answers));
        }
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let serving: Vec<std::thread::JoinHandle<()>> = server_runtimes
        .into_iter()
        .zip(at_servers)
        .map(|(runtime, sessions)| {
            let mut stopped = stopped.clone();
            std::thread::Builder::new().spawn(move || {
                for session in sessions {
                    runtime.spawn(answer_each(session, share));
                }
                runtime.block_on(async {
                    let _ = stopped.wait_for(|stop| *stop).await;
                });
                // Sessions wait on rings nobody writes any more.
                runtime.shutdown_background();
            })
        })
        .collect::<io::Result<_>>()?;
    // A thread refused from here on drops `stop`, which ends the servers.
    let working: Vec<std::thread::JoinHandle<_>> = worker_runtimes
        .into_iter()
        .zip(at_workers)
        .map(|(runtime, sessions)| {
            let each_worker = each_worker.clone();
            std::thread::Builder::new()
                .spawn(move || runtime.block_on(each_worker(sessions, share)))
        })
        .collect::<io::Result<_>>()?;
    let mut results = Vec::new();
    let mut failed = None;
    for worker in working {
        match worker.join().expect("a round-trip worker panicked") {
            Ok(result) => results.push(result),
            Err(error) => failed = Some(error),
        }
    }
    let _ = stop.send(true);
    for server in serving {
        server.join().expect("a round-trip server panicked");
    }
    match failed {
        Some(error) => Err(io::Error::other(error)),
        None => Ok(results),
    }
}

/// A server's side of one ring pair: reads `share` bytes, answers a word,
/// until a ring fails.
async fn answer_each((mut requests, mut answers): ServerEnds, share: usize) {
    let mut buffer = vec![0u8; share];
    while requests.read(&mut buffer).await.is_ok() {
        if answers.write_word(1).await.is_err() {
            return;
        }
        answers.flush();
    }
}

/// A worker's operations for `phase` (after one not timed): `share` bytes to
/// every server, then a word from each; each one's time in microseconds.
async fn time_each(
    mut sessions: Vec<WorkerEnds>,
    share: usize,
    phase: Duration,
) -> Result<Vec<f64>, ps_shm::ring::RingError> {
    let source = vec![0x5au8; share];
    let mut once = async || {
        let began = Instant::now();
        send_each(&mut sessions, &source).await?;
        for (_, answers) in &mut sessions {
            answers.read_word().await?;
        }
        Ok::<_, ps_shm::ring::RingError>(began.elapsed().as_secs_f64() * 1e6)
    };
    once().await?;
    let start = Instant::now();
    let mut times = Vec::new();
    while start.elapsed() < phase || times.is_empty() {
        times.push(once().await?);
    }
    Ok(times)
}

/// A worker's operations for `phase` with `window` in flight (each
/// operation `share` bytes to every server, then a word from each; the
/// next one goes out as each comes back): operations per second.
async fn count_windowed(
    mut sessions: Vec<WorkerEnds>,
    share: usize,
    window: usize,
    phase: Duration,
) -> Result<f64, ps_shm::ring::RingError> {
    let source = vec![0x5au8; share];
    for _ in 0..window {
        send_each(&mut sessions, &source).await?;
    }
    let start = Instant::now();
    let mut operations = 0u64;
    while start.elapsed() < phase || operations == 0 {
        for (_, answers) in &mut sessions {
            answers.read_word().await?;
        }
        send_each(&mut sessions, &source).await?;
        operations += 1;
    }
    Ok(operations as f64 / start.elapsed().as_secs_f64())
}

/// Writes `share` to every server of `sessions`, each published at once.
async fn send_each(
    sessions: &mut [WorkerEnds],
    share: &[u8],
) -> Result<(), ps_shm::ring::RingError> {
    for (requests, _) in sessions {
        requests.write(share).await?;
        requests.flush();
    }
    Ok(())
}

/// Runs `once` (which moves `size` bytes) repeatedly for `phase`; bytes per second.
fn rate(size: usize, phase: Duration, mut once: impl FnMut()) -> f64 {
    once();
    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < phase || runs == 0 {
        once();
        runs += 1;
    }
    (runs * size as u64) as f64 / start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_floor_copies_the_key_into_every_buffer_in_turn() {
        let source: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let mut targets = vec![vec![0u8; source.len()]; 3];
        let rate = copy_in_turn(&source, &mut targets, Duration::from_millis(5));
        assert!(rate > 0.0 && rate.is_finite(), "{rate}");
        for target in &targets {
            assert_eq!(target, &source);
        }
        // A window of none still copies into one buffer.
        let rate = memcpy_window_bytes_per_sec(4096, 0, Duration::from_millis(5));
        assert!(rate > 0.0 && rate.is_finite(), "{rate}");
    }

    #[test]
    fn a_round_trip_between_two_servers_and_two_workers_is_timed_and_every_thread_ends() {
        let p50 = round_trip_p50_us(4096, (2, 2), Duration::from_millis(50)).unwrap();
        assert!(p50 > 0.0 && p50.is_finite(), "{p50}");
    }

    #[test]
    fn round_trips_with_a_window_in_flight_are_counted_and_every_thread_ends() {
        let rate = round_trips_per_sec(4096, (2, 2), 8, Duration::from_millis(50)).unwrap();
        assert!(rate > 0.0 && rate.is_finite(), "{rate}");
    }

    #[test]
    fn a_round_trip_without_workers_is_an_error_not_a_figure() {
        for shape in [(1, 0), (0, 1)] {
            let phase = Duration::from_millis(10);
            let errors = [
                round_trip_p50_us(4096, shape, phase).unwrap_err(),
                round_trips_per_sec(4096, shape, 8, phase).unwrap_err(),
            ];
            for error in errors {
                let error = error.to_string();
                assert!(error.contains("a worker and a server"), "{error}");
            }
        }
    }
}
