//! Times `Sampler::fill` for IID against cyclic over a 1M index space, the sizes of issue 3.
//!
//! `cargo run --release -p zsampler --example fill_bench [-- REPEATS BATCHES]`: for each batch size
//! the two modes run interleaved, `REPEATS` times `BATCHES` consecutive batches each, and the
//! medians (ns per batch) and their ratio are printed. The machine's load moves the timings,
//! hence the interleaving and the medians.

use std::hint::black_box;
use std::time::Instant;

use zsampler::{Mode, Sampler};

const LENGTH: u64 = 1_000_000;

fn time_once(sampler: &Sampler, first: u64, batches: u64, out: &mut [u64]) -> f64 {
    let start = Instant::now();
    for step in first..first + batches {
        sampler.fill(step, out).expect("buffer sized to the batch");
        black_box(&mut *out);
    }
    start.elapsed().as_secs_f64() * 1e9 / batches as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let repeats: usize = args.next().map_or(11, |a| a.parse().expect("REPEATS"));
    let batches: u64 = args.next().map_or(3000, |a| a.parse().expect("BATCHES"));
    for batch_size in [256u64, 1024, 8192] {
        let iid = Sampler::new(LENGTH, batch_size, Mode::Iid, 0).expect("valid");
        let cyclic = Sampler::new(LENGTH, batch_size, Mode::Cyclic, 0).expect("valid");
        let mut out = vec![0u64; batch_size as usize];
        // Warm-up.
        time_once(&iid, 0, batches / 4 + 1, &mut out);
        time_once(&cyclic, 0, batches / 4 + 1, &mut out);
        let (mut ti, mut tc, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..repeats as u64 {
            let first = r * batches;
            let i = time_once(&iid, first, batches, &mut out);
            let c = time_once(&cyclic, first, batches, &mut out);
            ti.push(i);
            tc.push(c);
            ratios.push(c / i);
        }
        let (mi, mc) = (median(ti), median(tc));
        println!(
            "batch {batch_size:>5}: iid {mi:>9.0} ns  cyclic {mc:>9.0} ns  ratio of medians \
             {:.3}  median ratio {:.3}",
            mc / mi,
            median(ratios)
        );
    }
}
