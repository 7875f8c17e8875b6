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
        let w = share(recs, &mut rng, 500);
        let mut dst = vec![0u8; w.bytes];
        store.gather_parts(&w.idxs, &w.starts, &w.sizes, &mut dst, &w.offsets).unwrap();
        let mut at = 0usize;
        for &(i, s, n) in &w.parts {
            let want = &w.recs[i as usize][s as usize..(s + n) as usize];
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

/// One store's windows for [`zrecord::gather_parts_across`], laid out back to back.
struct Share {
    recs: Vec<Vec<u8>>,
    parts: Vec<(u64, u64, u64)>,
    idxs: Vec<u64>,
    starts: Vec<u64>,
    sizes: Vec<u64>,
    offsets: Vec<u64>,
    bytes: usize,
}

fn share(recs: Vec<Vec<u8>>, rng: &mut Rng, n: usize) -> Share {
    let lens: Vec<usize> = recs.iter().map(Vec::len).collect();
    let parts = windows(rng, &lens, n);
    let (mut idxs, mut starts, mut sizes, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut at = 0;
    for &(i, s, n) in &parts {
        idxs.push(i);
        starts.push(s);
        sizes.push(n);
        offsets.push(at);
        at += n;
    }
    Share { recs, parts, idxs, starts, sizes, offsets, bytes: at as usize }
}

#[test]
fn windows_of_several_stores_in_one_call_equal_their_slices() {
    // A raw and a zstd store (and the raw one again, as a second share), with every shard
    // count: each share's output holds its own windows, whichever block read them.
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut rng = Rng(11);
    let mut stores = vec![];
    let mut recs_of = vec![];
    for (k, codec) in [Codec::Raw, Codec::Zstd].into_iter().enumerate() {
        let store = open(dirs[k].path(), codec);
        let recs: Vec<Vec<u8>> =
            (0..40).map(|i| record(i + 100 * k as u64, (i as usize * 1531) % 70_000)).collect();
        let (buf, off) = pack(&recs);
        store.append(&buf, &off, None).unwrap();
        stores.push(store);
        recs_of.push(recs);
    }
    for shards in [1, 2, usize::MAX] {
        let shares = [
            share(recs_of[0].clone(), &mut rng, 300),
            share(recs_of[1].clone(), &mut rng, 200),
            share(recs_of[0].clone(), &mut rng, 50),
        ];
        let mut outs: Vec<Vec<u8>> = shares.iter().map(|s| vec![0u8; s.bytes]).collect();
        let store_of = [&stores[0], &stores[1], &stores[0]];
        let mut reads: Vec<zrecord::StoreParts<'_>> = shares
            .iter()
            .zip(outs.iter_mut())
            .zip(store_of)
            .map(|((s, dst), store)| zrecord::StoreParts {
                store,
                indices: &s.idxs,
                starts: &s.starts,
                lens: &s.sizes,
                dst,
                dst_offsets: &s.offsets,
            })
            .collect();
        zrecord::gather_parts_across(&mut reads, shards).unwrap();
        for (k, (s, out)) in shares.iter().zip(&outs).enumerate() {
            let mut at = 0usize;
            for &(i, start, n) in &s.parts {
                let want = &s.recs[i as usize][start as usize..(start + n) as usize];
                assert_eq!(&out[at..at + n as usize], want, "share {k} record {i}, {shards}");
                at += n as usize;
            }
        }
    }
}

#[test]
fn a_bad_window_in_any_store_refuses_the_whole_call() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let a = open(dirs[0].path(), Codec::Raw);
    let b = open(dirs[1].path(), Codec::Zstd);
    for s in [&a, &b] {
        let (buf, off) = pack(&[record(0, 100), record(1, 50)]);
        s.append(&buf, &off, None).unwrap();
    }
    let (mut da, mut db) = (vec![7u8; 10], vec![7u8; 10]);
    let ok = [0u64];
    let len = [10u64];
    let mut reads = [
        zrecord::StoreParts {
            store: &a,
            indices: &ok,
            starts: &ok,
            lens: &len,
            dst: &mut da,
            dst_offsets: &ok,
        },
        // record 1 holds 50 bytes: 45..55 is past its end
        zrecord::StoreParts {
            store: &b,
            indices: &[1],
            starts: &[45],
            lens: &len,
            dst: &mut db,
            dst_offsets: &ok,
        },
    ];
    let r = zrecord::gather_parts_across(&mut reads, usize::MAX);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert!(da.iter().chain(&db).all(|&x| x == 7), "a refused call wrote");
}
