//! One core: a 1 MiB gradient copied off a region in 64 KiB pieces, as the
//! server's reader does: plain copy; copy then scan (stop 54); copy marked (stop 55).
use std::time::Instant;
use ps_proto::codec::{DType, first_non_finite};
use ps_shm::copy::Mark;
use ps_shm::region::Region;

fn main() {
    const SIZE: usize = 1 << 20;
    const PIECE: usize = 64 << 10;
    let region = Region::create(2 * SIZE).unwrap();
    let data: Vec<u8> = (0..SIZE / 4).flat_map(|i| (i as f32 * 1e-3).to_le_bytes()).collect();
    region.copy_in(0, &data);
    let mut into = vec![0u8; SIZE];
    let run = |name: &str, into: &mut Vec<u8>, f: &dyn Fn(usize, &mut [u8]) -> bool| {
        let reps = 4000;
        let start = Instant::now();
        let mut found = false;
        for _ in 0..reps {
            for (k, piece) in into.chunks_mut(PIECE).enumerate() {
                found |= f(k * PIECE / 8, piece);
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!("{name:14} {:6.2} GB/s  {:5.1} us per MiB  found {found}", (reps * SIZE) as f64 / secs / 1e9, secs / reps as f64 * 1e6);
    };
    for _ in 0..3 {
        run("copy", &mut into, &|w, p| { region.copy_out(w, p); false });
        run("copy+scan", &mut into, &|w, p| { region.copy_out(w, p); first_non_finite(DType::F32, p).is_some() });
        run("copy marked", &mut into, &|w, p| region.copy_out_marked(w, p, Mark::U32(0x7f80_0000)));
    }
}
