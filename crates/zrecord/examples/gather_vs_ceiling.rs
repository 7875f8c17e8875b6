//! The engine against the benchmark's ceiling with no Python in between:
//! `cargo run --release -p zrecord --example gather_vs_ceiling [RECORD_BYTES] [DST_SHIFT]
//! [STORE_MIB] [ROUNDS]`.
//!
//! Writes `STORE_MIB` (default 240; a small store stays in the CPU's caches, where the fixed
//! costs per batch and per record show) of raw records to a temporary store, then times batches of 256 random
//! records (sorted) read three ways into the same destination: `ceiling::copy_records` from an
//! in-memory copy of the data (page-aligned, like a chunk), `Store::gather` and
//! `Store::gather_fixed`. `DST_SHIFT` places the destination that many bytes past a page
//! boundary (`NumPy`'s large arrays sit 16 bytes in). Prints the median of 7 rounds for each.

use std::time::Instant;

use zrecord::{Codec, Options, Store};

const BATCH: usize = 256;

fn page_aligned(len: usize, shift: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + 8192];
    let start = (4096 - v.as_ptr() as usize % 4096) % 4096 + shift;
    (v, start)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().map_or(12 * 1024, |s| s.parse().expect("RECORD_BYTES"));
    let shift: usize = args.next().map_or(16, |s| s.parse().expect("DST_SHIFT"));
    let mib: usize = args.next().map_or(240, |s| s.parse().expect("STORE_MIB"));
    let rounds: usize = args.next().map_or(7, |s| s.parse().expect("ROUNDS"));
    let n = (mib << 20) / size;

    let (mut src_buf, src_at) = page_aligned(n * size, 0);
    let data = &mut src_buf[src_at..src_at + n * size];
    let mut x: u64 = 1;
    for b in data.iter_mut() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *b = (x >> 33) as u8;
    }
    let dir = std::env::temp_dir().join(format!("zrecord-ceiling-{}", std::process::id()));
    let store = Store::open(&dir, Options { codec: Codec::Raw, ..Default::default() }).unwrap();
    let per_append = (64 << 20) / size;
    for first in (0..n).step_by(per_append) {
        let m = per_append.min(n - first);
        let offsets: Vec<u64> = (0..m as u64).map(|k| k * size as u64).collect();
        store.append(&data[first * size..(first + m) * size], &offsets, None).unwrap();
    }
    store.sync().unwrap();

    let batches: Vec<Vec<u64>> = (0..100u64)
        .map(|b| {
            let mut rng = b.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut idx: Vec<u64> = Vec::with_capacity(BATCH);
            while idx.len() < BATCH {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let i = rng % n as u64;
                if !idx.contains(&i) || idx.len() as u64 >= n as u64 {
                    idx.push(i);
                }
            }
            idx.sort_unstable();
            idx
        })
        .collect();
    let offsets: Vec<u64> = (0..BATCH as u64).map(|k| k * size as u64).collect();
    let (mut dst_buf, dst_at) = page_aligned(BATCH * size, shift);
    let dst = &mut dst_buf[dst_at..dst_at + BATCH * size];

    let ways = ["ceiling", "gather", "gather_fixed"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    for _round in 0..rounds {
        for (w, way) in ways.iter().enumerate() {
            let t = Instant::now();
            for idx in &batches {
                match *way {
                    "ceiling" => zrecord::ceiling::copy_records(data, size, idx, dst),
                    "gather" => store.gather(idx, dst, &offsets).unwrap(),
                    _ => store.gather_fixed(idx, dst, size, usize::MAX).unwrap(),
                }
            }
            times[w].push(t.elapsed().as_secs_f64() / batches.len() as f64);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ceiling = median(&mut times[0].clone());
    println!("{size}-byte records, batch {BATCH}, destination {shift} bytes past a page");
    for (w, way) in ways.iter().enumerate() {
        let t = median(&mut times[w]);
        let mib = (BATCH * size) as f64 / t / f64::from(1 << 20);
        println!(
            "{way:>13}: {:7.1} us/batch {mib:8.0} MiB/s  {:.2}x ceiling",
            t * 1e6,
            ceiling / t
        );
    }
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
