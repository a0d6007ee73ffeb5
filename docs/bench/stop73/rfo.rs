#![allow(non_snake_case, static_mut_refs)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

static mut SIZE: usize = 16384;
const SLOTS: usize = 64; // a 1 MiB ring of 16 KiB slots

fn main() {
    let mode = std::env::args().nth(1).unwrap_or("shared".into());
    unsafe { SIZE = std::env::args().nth(2).map_or(16384, |a| a.parse().unwrap()) };
    let LEN = unsafe { SIZE };
    let ring: Arc<Vec<Line>> = Arc::new(vec![Line([1u8; 64]); LEN * SLOTS / 64 + 1]);
    let src = vec![7u8; LEN];
    let turn = Arc::new(AtomicU64::new(0));
    let reader = {
        let ring = Arc::clone(&ring);
        let turn = Arc::clone(&turn);
        let mode = mode.clone();
        std::thread::spawn(move || {
            let LEN = unsafe { SIZE };
            let mut dst = vec![0u8; LEN];
            let mut i = 1u64;
            let mut rs = 0f64;
            loop {
                while turn.load(Ordering::Acquire) != i { std::hint::spin_loop(); }
                if i > 200_000 { break rs; }
                let t = Instant::now();
                if mode != "alone" {
                    let slot = (i as usize / 2) % SLOTS;
                    unsafe { std::ptr::copy_nonoverlapping((ring.as_ptr() as *const u8).add(slot * LEN), dst.as_mut_ptr(), LEN) };
                }
                std::hint::black_box(&dst);
                rs += t.elapsed().as_secs_f64();
                turn.store(i + 1, Ordering::Release);
                i += 2;
            }
        })
    };
    let ptr = ring.as_ptr() as *mut u8;
    let began = Instant::now();
    let mut spent = 0f64;
    let mut i = 0u64;
    let mut n = 0;
    while i < 200_000 {
        let slot = (i as usize / 2) % SLOTS;
        let t = Instant::now();
        if mode == "nt" {
            unsafe { nt_copy(src.as_ptr(), ptr.add(slot * LEN), LEN) };
        } else if mode == "pfw" {
            unsafe { pfw_copy(src.as_ptr(), ptr.add(slot * LEN), LEN) };
        } else {
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.add(slot * LEN), LEN) };
        }
        spent += t.elapsed().as_secs_f64();
        n += 1;
        turn.store(i + 1, Ordering::Release);
        i += 2;
        while turn.load(Ordering::Acquire) != i { std::hint::spin_loop(); }
    }
    turn.store(200_001, Ordering::Release);
    let rs = reader.join().unwrap();
    println!("{mode}: {:.2} us per write, {:.2} GB/s; reader {:.2} us a read; {:.2} us a round", spent / n as f64 * 1e6, LEN as f64 * n as f64 / spent / 1e9, rs / n as f64 * 1e6, began.elapsed().as_secs_f64() / n as f64 * 1e6);
}

#[target_feature(enable = "avx2")]
unsafe fn nt_copy(from: *const u8, to: *mut u8, len: usize) {
    use std::arch::x86_64::*;
    let mut at = 0;
    while at < len {
        let v = _mm256_loadu_si256(from.add(at).cast());
        _mm256_stream_si256(to.add(at).cast(), v);
        at += 32;
    }
    _mm_sfence();
}
#[target_feature(enable = "avx2")]
unsafe fn pfw_copy(from: *const u8, to: *mut u8, len: usize) {
    use std::arch::x86_64::*;
    let mut at = 0;
    while at < len {
        if at + 1024 < len { _mm_prefetch::<{_MM_HINT_ET0}>(to.add(at + 1024).cast()); }
        let v = _mm256_loadu_si256(from.add(at).cast());
        _mm256_storeu_si256(to.add(at).cast(), v);
        at += 32;
    }
}

#[derive(Clone, Copy)]
#[repr(align(64))]
struct Line([u8; 64]);
