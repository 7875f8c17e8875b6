//! The one-step raw append of same-size records (`append.rs`, `plan_fixed`) against records
//! placed one by one: the same workload written raw, and written with zstd on records that
//! zstd cannot shrink (so the engine compresses, gives up and stores each raw, placing it by
//! itself), gives byte-identical stores -- chunk files and table -- on random sizes and
//! starting places, with batches that cross a chunk end (the one-step path then falls back)
//! and ragged batches between them.

mod common;

use std::path::Path;

use common::{open_small_chunks, pack, read_all, Rng};
use zrecord::{Codec, Store};

/// Small chunks, so that many batches meet a chunk end.
const CAPACITY: u64 = 4096;

/// Random (incompressible) bytes.
fn noise(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

/// Batches of same-size records (sizes 1..=600, up to a few chunks' worth), with a ragged
/// batch now and then.
fn batches(seed: u64) -> Vec<Vec<Vec<u8>>> {
    let mut rng = Rng(seed);
    (0..120)
        .map(|_| {
            let n = 1 + rng.below(40) as usize;
            if rng.below(6) == 0 {
                (0..n)
                    .map(|_| {
                        let len = rng.below(300) as usize;
                        noise(&mut rng, len)
                    })
                    .collect()
            } else {
                let most = if rng.below(3) == 0 { 600 } else { 24 };
                let size = 1 + rng.below(most) as usize;
                (0..n).map(|_| noise(&mut rng, size)).collect()
            }
        })
        .collect()
}

/// The store's files by name: every chunk whole, the used prefix of the (sparse) table.
fn store_bytes(dir: &Path, records: u64) -> Vec<(String, Vec<u8>)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let mut bytes = std::fs::read(dir.join(&name)).unwrap();
            if name == "meta.zr" {
                bytes.truncate((16 + records * 16) as usize);
            }
            (name, bytes)
        })
        .collect()
}

fn write(dir: &Path, codec: Codec, batches: &[Vec<Vec<u8>>]) -> Store {
    let store = open_small_chunks(dir, codec, CAPACITY);
    for batch in batches {
        let (buf, offsets) = pack(batch);
        store.append(&buf, &offsets, None).unwrap();
    }
    store.sync().unwrap();
    store
}

#[test]
fn one_step_and_one_by_one_give_the_same_bytes() {
    for seed in 1..=6 {
        let work = batches(seed);
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let fast = write(a.path(), Codec::Raw, &work);
        let slow = write(b.path(), Codec::Zstd, &work);
        let want: Vec<Vec<u8>> = work.concat();
        assert_eq!(read_all(&fast), want, "seed {seed}");
        assert_eq!(read_all(&slow), want, "seed {seed}");
        let n = fast.len();
        assert!(a.path().join("3.zr").exists(), "the workload spans several chunks");
        assert_eq!(store_bytes(a.path(), n), store_bytes(b.path(), n), "seed {seed}");
    }
}

/// A batch that ends exactly at a chunk's end moves the frontier to the next chunk, and one
/// a byte longer than the room left falls back: both as placed one by one.
#[test]
fn exact_fits_and_one_byte_over() {
    for (first, size, n) in [(96u64, 8usize, 500usize), (96, 8, 501), (0, 4096, 1), (1, 4096, 2)] {
        let mut rng = Rng(first * 7 + n as u64);
        let lead = vec![noise(&mut rng, first as usize)];
        let batch: Vec<Vec<u8>> = (0..n).map(|_| noise(&mut rng, size)).collect();
        let work = if first > 0 { vec![lead, batch.clone(), batch] } else { vec![batch] };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let fast = write(a.path(), Codec::Raw, &work);
        let slow = write(b.path(), Codec::Zstd, &work);
        assert_eq!(read_all(&fast), work.concat());
        assert_eq!(read_all(&slow), work.concat());
        let n = fast.len();
        assert_eq!(store_bytes(a.path(), n), store_bytes(b.path(), n), "{first} {size} {n}");
    }
}
