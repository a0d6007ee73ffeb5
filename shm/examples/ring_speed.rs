//! How fast bytes go through one ring in this process, one task writing and
//! one reading, against a single-thread memcpy of the same size.
//!
//! cargo run --release -p ps-shm --example ring_speed -- [MiB] [ring KiB]

use std::time::Instant;

use ps_shm::ring::in_process;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().unwrap_or(16));
    let size = args.next().unwrap_or(16) << 20;
    let ring_kib = args.next().unwrap_or(1024) as u64;
    let rounds = 40;
    let source = vec![0x5au8; size];
    let mut target = vec![0u8; size];
    let start = Instant::now();
    for _ in 0..rounds {
        target.copy_from_slice(std::hint::black_box(&source));
    }
    let memcpy = (rounds * size) as f64 / start.elapsed().as_secs_f64();
    let (mut writer, mut reader, _, _) = in_process(ring_kib << 10)?;
    let start = Instant::now();
    let writing = tokio::spawn(async move {
        for _ in 0..rounds {
            writer.write(&source).await.expect("write");
            writer.flush();
        }
    });
    for _ in 0..rounds {
        reader.read(&mut target).await.expect("read");
    }
    writing.await.expect("the writer");
    let ring = (rounds * size) as f64 / start.elapsed().as_secs_f64();
    println!(
        "{} MiB through a {ring_kib} KiB ring: {:.2} GB/s; memcpy {:.2} GB/s ({:.2})",
        size >> 20,
        ring / 1e9,
        memcpy / 1e9,
        ring / memcpy
    );
    Ok(())
}
