//! `gather_parts`: windows of records, checked against slices of whole-record reads, for raw,
//! zstd and mixed stores, with windows of one record asked for several times, and refused
//! arguments that write nothing.

mod common;
use common::*;
use zrecord::{Codec, Error};

fn windows(rng: &mut Rng, lens: &[usize], n: usize) -> Vec<(u64, u64, u64)> {
    (0..n)
        .map(|_| {
            let index = rng.below(lens.len() as u64);
            let len = lens[index as usize] as u64;
            let start = rng.below(len + 1);
            let size = rng.below(len - start + 1);
            (index, start, size)
        })
        .collect()
}

#[test]
fn windows_equal_slices_of_whole_records() {
    for codec in [Codec::Raw, Codec::Zstd] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), codec);
        let lens: Vec<usize> = (0..60).map(|i| (i * 977) % 5000).collect();
        let recs: Vec<Vec<u8>> =
            lens.iter().enumerate().map(|(i, &n)| record(i as u64, n)).collect();
        let (buf, off) = pack(&recs);
        store.append(&buf, &off, None).unwrap();
        let mut rng = Rng(codec as u64 + 3);
        let parts = windows(&mut rng, &lens, 500);
        let (mut idxs, mut starts, mut sizes, mut offsets) = (vec![], vec![], vec![], vec![]);
        let mut at = 0;
        for &(i, s, n) in &parts {
            idxs.push(i);
            starts.push(s);
            sizes.push(n);
            offsets.push(at);
            at += n;
        }
        let mut dst = vec![0u8; at as usize];
        store.gather_parts(&idxs, &starts, &sizes, &mut dst, &offsets).unwrap();
        let mut at = 0usize;
        for &(i, s, n) in &parts {
            let want = &recs[i as usize][s as usize..(s + n) as usize];
            assert_eq!(&dst[at..at + n as usize], want, "{codec:?} record {i} window {s}+{n}");
            at += n as usize;
        }
    }
}

/// Indices, starts, lengths, destination offsets.
type Case = (Vec<u64>, Vec<u64>, Vec<u64>, Vec<u64>);

#[test]
fn bad_windows_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Zstd);
    let recs = vec![record(0, 100), record(1, 50)];
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    let mut dst = vec![7u8; 64];
    let cases: Vec<Case> = vec![
        (vec![0], vec![90], vec![11], vec![0]), // past the record's end
        (vec![2], vec![0], vec![1], vec![0]),   // no such record
        (vec![0, 1], vec![0, 0], vec![10, 10], vec![0, 5]), // overlapping destinations
        (vec![0], vec![0], vec![65], vec![0]),  // past the destination
        (vec![0], vec![u64::MAX], vec![2], vec![0]), // start + len overflows
        (vec![0, 1], vec![0], vec![1], vec![0]), // arrays of different lengths
    ];
    for (idxs, starts, lens, offsets) in cases {
        let r = store.gather_parts(&idxs, &starts, &lens, &mut dst, &offsets);
        assert!(
            matches!(r, Err(Error::InvalidArgument(_) | Error::IndexOutOfRange { .. })),
            "{idxs:?} {starts:?} {lens:?} {offsets:?}: {r:?}"
        );
        assert!(dst.iter().all(|&b| b == 7), "a refused call wrote");
    }
}
