//! [`Checkpointer`]: when a server writes its checkpoints — every `every_steps`
//! versions of progress or every `every` of wall time (whichever comes first, and
//! only when something changed), on request (`Checkpoint` RPC), and once more on
//! shutdown. Files are written off the async runtime by [`crate::checkpoint`].
//! How long each took and when the newest was written are kept in
//! [`CheckpointTimes`] for the server's metrics.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use ps_proto::ids::Version;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::{self, CheckpointError};
use crate::store::Store;

/// Versions of progress between checkpoints, by default.
pub const DEFAULT_CHECKPOINT_EVERY_STEPS: u64 = 50;

/// Time with progress between checkpoints, by default.
pub const DEFAULT_CHECKPOINT_EVERY: Duration = Duration::from_secs(30);

/// Where and how often to checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The checkpoint root: one folder per server, shared by servers that share it.
    pub root: PathBuf,
    /// This server's folder name under the root.
    pub folder: String,
    /// Checkpoint after this many versions of progress (0: never by steps).
    pub every_steps: u64,
    /// Checkpoint after this much time with progress (zero: never by time).
    pub every: Duration,
}

impl CheckpointConfig {
    /// This server's own folder.
    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.folder)
    }
}

/// What one checkpoint wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The file.
    pub path: PathBuf,
    /// Keys in it.
    pub keys: usize,
    /// The highest key version in it.
    pub version: Version,
}

/// How long checkpoints took, and when the newest one was written.
#[derive(Debug, Clone)]
pub struct CheckpointTimes {
    /// Each checkpoint's time to write, in seconds.
    pub durations: Histogram,
    /// When the newest checkpoint was written, in seconds since the Unix epoch
    /// (0 before the first).
    pub newest: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl Default for CheckpointTimes {
    fn default() -> Self {
        Self {
            // 1 ms to about 65 s, doubling.
            durations: Histogram::new(exponential_buckets(1e-3, 2.0, 17)),
            newest: Gauge::default(),
        }
    }
}

impl CheckpointTimes {
    fn record(&self, took: Duration) {
        self.durations.observe(took.as_secs_f64());
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.newest.set(now.as_secs_f64());
    }

    /// Seconds since the newest checkpoint was written; `None` before the first.
    pub fn age(&self) -> Option<f64> {
        let newest = self.newest.get();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        (newest > 0.0).then(|| (now.as_secs_f64() - newest).max(0.0))
    }
}

/// Writes a store's checkpoints.
#[derive(Debug)]
pub struct Checkpointer {
    store: Arc<Store>,
    config: CheckpointConfig,
    times: CheckpointTimes,
    /// The progress (highest version) and time of the last checkpoint; held while
    /// one is written, so two never interleave.
    last: Mutex<(Version, Instant)>,
    /// Checkpoints written since the last INFO summary, and when that was.
    summary: Mutex<(usize, Option<Instant>)>,
}

/// How often at most the INFO line about checkpoints comes.
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

impl Checkpointer {
    /// A checkpointer of `store`.
    pub fn new(store: Arc<Store>, config: CheckpointConfig) -> Self {
        Self {
            store,
            config,
            times: CheckpointTimes::default(),
            last: Mutex::new((Version(0), Instant::now())),
            summary: Mutex::new((0, None)),
        }
    }

    /// How long checkpoints took, and when the newest was written.
    pub fn times(&self) -> &CheckpointTimes {
        &self.times
    }

    /// Writes a checkpoint now.
    ///
    /// # Errors
    /// [`CheckpointError`]; the previous checkpoint is then intact.
    pub async fn write_now(&self) -> Result<Written, CheckpointError> {
        let mut last = self.last.lock().await;
        let started = Instant::now();
        let version = self.store.max_version();
        let keys = self.store.checkpoint_keys();
        let count = keys.len();
        let dir = self.config.dir();
        let path = tokio::task::spawn_blocking(move || checkpoint::write(&dir, &keys))
            .await
            .map_err(|e| CheckpointError::Io {
                path: self.config.dir(),
                source: std::io::Error::other(e),
            })??;
        *last = (version, Instant::now());
        self.times.record(started.elapsed());
        tracing::debug!(path = %path.display(), keys = count, %version, "checkpoint written");
        self.summarise(&path, version).await;
        Ok(Written {
            path,
            keys: count,
            version,
        })
    }

    /// Says at INFO that checkpoints are being written: for the first one, then at
    /// most once every [`SUMMARY_EVERY`], with how many were written meanwhile
    /// (each one is logged at DEBUG).
    async fn summarise(&self, path: &std::path::Path, version: Version) {
        let mut summary = self.summary.lock().await;
        summary.0 += 1;
        if summary.1.is_some_and(|at| at.elapsed() < SUMMARY_EVERY) {
            return;
        }
        let written = std::mem::take(&mut summary.0);
        let since = summary.1.map(|at| at.elapsed());
        summary.1 = Some(Instant::now());
        tracing::info!(newest = %path.display(), %version, written, ?since, "checkpoints written");
    }

    /// True when enough progress or time has passed since the last checkpoint.
    async fn due(&self) -> bool {
        let (version, at) = *self.last.lock().await;
        let now = self.store.max_version();
        let progressed = now > version;
        let by_steps = self.config.every_steps > 0
            && now.get() >= version.get().saturating_add(self.config.every_steps);
        let by_time = !self.config.every.is_zero() && at.elapsed() >= self.config.every;
        progressed && (by_steps || by_time)
    }

    /// Checkpoints whenever due until `stop`, then once more if anything changed.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let tick = Duration::from_millis(100);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(tick) => {}
            }
            if self.due().await
                && let Err(error) = self.write_now().await
            {
                tracing::error!(%error, "checkpoint failed; the previous one is kept");
            }
        }
        let changed = self.store.max_version() > self.last.lock().await.0;
        if changed && let Err(error) = self.write_now().await {
            tracing::error!(%error, "final checkpoint failed; the previous one is kept");
        }
    }
}
