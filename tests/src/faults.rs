//! [`FaultyProxy`]: a TCP proxy between a client and a server that injects the
//! faults a real network has: it delays bytes in both directions, and sometimes
//! cuts a connection just as the server's bytes come back — after the server has
//! acted on a request but before the client hears the answer, the case that makes
//! a retry a duplicate. The randomness is seeded, so a failure can be replayed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy)]
pub struct FaultPlan {
    /// Chance, per read from the server, of cutting the connection instead of
    /// passing the bytes on.
    pub cut_response: f64,
    /// Chance, per read in either direction, of holding the bytes back first.
    pub delay: f64,
    /// The longest hold-back.
    pub max_delay: Duration,
    /// Seed of the randomness.
    pub seed: u64,
}

/// A running proxy; it stops when dropped.
pub struct FaultyProxy {
    /// The address clients connect to.
    pub addr: SocketAddr,
    cuts: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// A small seeded generator (SplitMix64), one per direction of each connection.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn delay(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.unit())
    }
}

impl FaultyProxy {
    /// Listens on a free loopback port and forwards to `target` under `plan`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(target: SocketAddr, plan: FaultPlan) -> std::io::Result<Self> {
        Self::start_on(TcpListener::bind("127.0.0.1:0").await?, target, plan)
    }

    /// Forwards what `listener` accepts to `target` under `plan`.
    ///
    /// # Errors
    /// When the listener has no address.
    pub fn start_on(
        listener: TcpListener,
        target: SocketAddr,
        plan: FaultPlan,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let cuts = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&cuts);
        let task = tokio::spawn(async move {
            let mut connection = 0u64;
            while let Ok((client, _)) = listener.accept().await {
                connection += 1;
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let seed = plan.seed ^ connection.wrapping_mul(0x2545_F491_4F6C_DD1D);
                tokio::spawn(splice(client, server, plan, seed, Arc::clone(&counter)));
            }
        });
        Ok(Self { addr, cuts, task })
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Relaxed)
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn splice(
    client: TcpStream,
    server: TcpStream,
    plan: FaultPlan,
    seed: u64,
    cuts: Arc<AtomicU64>,
) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upstream = pump(client_read, server_write, plan, Dice(seed), None);
    let downstream = pump(server_read, client_write, plan, Dice(!seed), Some(cuts));
    // Either direction ending (or being cut) closes both.
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// Copies bytes from `from` to `to` with the plan's faults; `cuts` is set on the
/// server-to-client direction, the one that may be cut.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    plan: FaultPlan,
    mut dice: Dice,
    cuts: Option<Arc<AtomicU64>>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(cuts) = &cuts
            && dice.chance(plan.cut_response)
        {
            cuts.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if dice.chance(plan.delay) {
            tokio::time::sleep(dice.delay(plan.max_delay)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
