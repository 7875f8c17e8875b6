//! Helpers shared by the integration tests: deterministic record contents, packing, and a
//! gather-everything reader.
#![allow(dead_code)]

use zrecord::{Codec, Options, Store};

/// A small deterministic generator (`SplitMix64`), so tests need no RNG crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Record `tag` of `len` bytes: mildly compressible (a repeating ramp with noise), unique per tag.
pub fn record(tag: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(tag.wrapping_mul(31).wrapping_add(7));
    (0..len)
        .map(|i| {
            let noise = if i % 7 == 0 { rng.next() as u8 } else { 0 };
            (((i / 3) % 32) as u8).wrapping_add(tag as u8).wrapping_add(noise)
        })
        .collect()
}

/// Packs records into one buffer plus start offsets, as `append` takes them.
pub fn pack(records: &[Vec<u8>]) -> (Vec<u8>, Vec<u64>) {
    let mut buf = Vec::new();
    let mut offsets = Vec::new();
    for r in records {
        offsets.push(buf.len() as u64);
        buf.extend_from_slice(r);
    }
    (buf, offsets)
}

/// Reads every record back with one gather.
pub fn read_all(store: &Store) -> Vec<Vec<u8>> {
    let n = store.len();
    let idx: Vec<u64> = (0..n).collect();
    read(store, &idx)
}

/// Reads the given records with one gather into a packed buffer.
pub fn read(store: &Store, idx: &[u64]) -> Vec<Vec<u8>> {
    let lens = store.lengths(idx).unwrap();
    let mut offsets = Vec::new();
    let mut total = 0u64;
    for &l in &lens {
        offsets.push(total);
        total += u64::from(l);
    }
    let mut dst = vec![0u8; total as usize];
    store.gather(idx, &mut dst, &offsets).unwrap();
    offsets
        .iter()
        .zip(&lens)
        .map(|(&o, &l)| dst[o as usize..o as usize + l as usize].to_vec())
        .collect()
}

/// Appends `n` records of 100 to 800 bytes, then deletes every third one, leaving holes for
/// compaction to reclaim; returns the records the store then holds, in index order.
pub fn fill_with_holes(store: &Store, n: u64) -> Vec<Vec<u8>> {
    let recs: Vec<Vec<u8>> = (0..n).map(|i| record(i, 100 + (i as usize * 37) % 700)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    let targets: Vec<u64> = (0..n).filter(|i| i % 3 == 0).collect();
    store.delete(&targets).unwrap();
    let mut model = recs;
    for &t in targets.iter().rev() {
        model.swap_remove(t as usize);
    }
    model
}

pub fn open(dir: &std::path::Path, codec: Codec) -> Store {
    Store::open(dir, Options { codec, ..Options::default() }).unwrap()
}

pub fn open_small_chunks(dir: &std::path::Path, codec: Codec, capacity: u64) -> Store {
    Store::open(dir, Options { codec, chunk_capacity: capacity }).unwrap()
}
