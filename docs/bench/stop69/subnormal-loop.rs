use std::time::Instant;
#[inline(never)]
fn adam(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32]) {
    let (beta1, omb1, beta2, omb2, m_scale, v_scale, eps, lr, decay) = (0.9f32, 0.1f32, 0.999f32, 0.001f32, 1.0f32, 1.0f32, 1e-8f32, 0.005f64, 1.0f64);
    for ((w, (m, v)), &g) in w.iter_mut().zip(m.iter_mut().zip(v.iter_mut())).zip(g) {
        let m1 = beta1 * *m + omb1 * g;
        let v1 = beta2 * *v + omb2 * (g * g);
        let step = (m1 * m_scale) / ((v1 * v_scale).sqrt() + eps);
        *w = (f64::from(*w) * decay - lr * f64::from(step)) as f32;
        (*m, *v) = (m1, v1);
    }
}
fn main() {
    let n = 4810;
    for &(gm, mv) in &[(1e-6f32, 1e-6f32), (1e-20, 1e-6), (1e-6, 1e-39), (1e-20, 1e-39), (0.0, 1e-39), (0.0,0.0)] {
        let mut w = vec![0.5f32; n]; let mut m = vec![mv; n]; let mut v = vec![mv; n];
        let g = vec![gm; n];
        let t = Instant::now();
        for _ in 0..1000 { adam(&mut w, &mut m, &mut v, &g); m.iter_mut().for_each(|x| *x = mv); v.iter_mut().for_each(|x| *x = mv); }
        println!("g={gm:e} m,v={mv:e}: {:.2} us per 4810", t.elapsed().as_secs_f64() * 1e6 / 1000.0);
    }
}
