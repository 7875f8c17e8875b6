//! Reads over several stores in one call (`zrecord::across`): the same bytes as reading each
//! store alone, records of any store in any batch order, and bad offsets and indices refused.

mod common;
use common::*;
use zrecord::across::{
    gather_across, gather_fixed_across, gather_fixed_shares, lengths_across, FixedShare, Starts,
};
use zrecord::{Codec, Error, Store};

/// Three stores of 40 fixed 24-byte records each; record r of store k is `record(k * 1000 + r)`.
fn stores(dirs: &[tempfile::TempDir], codec: Codec) -> Vec<Store> {
    dirs.iter()
        .enumerate()
        .map(|(k, d)| {
            let s = open_small_chunks(d.path(), codec, 1 << 20);
            let recs: Vec<Vec<u8>> = (0..40).map(|r| record(k as u64 * 1000 + r, 24)).collect();
            let (buf, off) = pack(&recs);
            s.append(&buf, &off, None).unwrap();
            s
        })
        .collect()
}

#[test]
fn a_batch_across_stores_equals_each_record_read_alone() {
    // Unsorted (grouped by a counting sort) and sorted (each store a run of the batch).
    for (codec, sorted) in [(Codec::Raw, false), (Codec::Zstd, false), (Codec::Raw, true)] {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let owned = stores(&dirs, codec);
        let refs: Vec<&Store> = owned.iter().collect();
        let mut rng = Rng(7);
        let mut idx: Vec<u64> = (0..200).map(|_| rng.below(120)).collect();
        if sorted {
            idx.sort_unstable();
        }
        let (parts, local): (Vec<u64>, Vec<u64>) = idx.iter().map(|&i| (i / 40, i % 40)).unzip();
        let starts = Starts::new(3, vec![0, 40, 80, 120]).unwrap();
        let want: Vec<u8> =
            parts.iter().zip(&local).flat_map(|(&p, &i)| record(p * 1000 + i, 24)).collect();
        let mut got = vec![0u8; 200 * 24];
        gather_fixed_across(&refs, &starts, &idx, None, &mut got, 24, usize::MAX).unwrap();
        assert!(got == want, "fixed ({codec:?}, sorted {sorted})");
        // Into every other row of a larger buffer; rows between stay untouched.
        let rows: Vec<u64> = (0..200).map(|i| 2 * i).collect();
        let mut spread = vec![0xAAu8; 400 * 24];
        gather_fixed_across(&refs, &starts, &idx, Some(&rows), &mut spread, 24, 1).unwrap();
        for i in 0..200 {
            assert!(spread[2 * i * 24..(2 * i + 1) * 24] == want[i * 24..(i + 1) * 24]);
            assert!(spread[(2 * i + 1) * 24..(2 * i + 2) * 24].iter().all(|&b| b == 0xAA));
        }
        // Back to back at offsets, as a ragged read lays them out (here in reverse).
        let offsets: Vec<u64> = (0..200).map(|i| (199 - i) * 24).collect();
        let mut at = vec![0u8; 200 * 24];
        gather_across(&refs, &starts, &idx, &mut at, &offsets).unwrap();
        for i in 0..200 {
            let o = (199 - i) * 24;
            assert!(at[o..o + 24] == want[i * 24..(i + 1) * 24]);
        }
        assert_eq!(lengths_across(&refs, &starts, &idx).unwrap(), vec![24; 200]);
    }
}

#[test]
fn an_empty_store_between_others_is_passed_over() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let owned = stores(&dirs, Codec::Raw);
    let refs: Vec<&Store> = owned.iter().collect();
    // The middle store contributes no records: 0..40 are store 0's, 40..60 store 2's first 20.
    let starts = Starts::new(3, vec![0, 40, 40, 60]).unwrap();
    let idx = [0, 39, 40, 59];
    let mut got = vec![0u8; 4 * 24];
    gather_fixed_across(&refs, &starts, &idx, None, &mut got, 24, 1).unwrap();
    let want: Vec<u8> = [0, 39, 2000, 2019].iter().flat_map(|&r| record(r, 24)).collect();
    assert!(got == want);
}

#[test]
fn bad_offsets_and_indices_are_refused() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let owned = stores(&dirs, Codec::Raw);
    let refs: Vec<&Store> = owned.iter().collect();
    let mut dst = vec![0xAAu8; 2 * 24];
    // An index past the concatenation fails before any store is read.
    let two = Starts::new(2, vec![0, 40, 80]).unwrap();
    let past = gather_fixed_across(&refs, &two, &[1, 80], None, &mut dst, 24, 1);
    assert!(matches!(past, Err(Error::IndexOutOfRange { index: 80, len: 80 })));
    assert!(dst.iter().all(|&b| b == 0xAA));
    for starts in [vec![0, 40], vec![1, 40, 80], vec![0, 50, 40]] {
        let bad = Starts::new(2, starts.clone());
        assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{starts:?}");
    }
    // Offsets for three stores given two.
    let three = Starts::new(3, vec![0, 40, 80, 120]).unwrap();
    let bad = gather_fixed_across(&refs, &three, &[1], None, &mut dst[..24], 24, 1);
    assert!(matches!(bad, Err(Error::InvalidArgument(_))));
    // Offsets that claim more records than a store holds: its own check refuses the index.
    let beyond = lengths_across(&refs, &Starts::new(2, vec![0, 50, 90]).unwrap(), &[45]);
    assert!(matches!(beyond, Err(Error::IndexOutOfRange { index: 45, len: 40 })));
}

#[test]
fn shares_of_several_stores_read_in_one_job_equal_each_record() {
    // Three stores (raw, zstd, raw) of 4 KiB records and shares of uneven sizes, so that the
    // blocks of the job cut through stores at every shard count.
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let len = 4096;
    let owned: Vec<Store> = [Codec::Raw, Codec::Zstd, Codec::Raw]
        .into_iter()
        .enumerate()
        .map(|(k, codec)| {
            let s = open(dirs[k].path(), codec);
            let recs: Vec<Vec<u8>> = (0..90).map(|r| record(k as u64 * 1000 + r, len)).collect();
            let (buf, off) = pack(&recs);
            s.append(&buf, &off, None).unwrap();
            s
        })
        .collect();
    let mut rng = Rng(5);
    for shards in [1, 2, 3, usize::MAX] {
        let idx: Vec<Vec<u64>> =
            [70, 5, 130].iter().map(|&n| (0..n).map(|_| rng.below(90)).collect()).collect();
        let mut outs: Vec<Vec<u8>> = idx.iter().map(|i| vec![0u8; i.len() * len]).collect();
        let mut shares: Vec<FixedShare<'_>> = owned
            .iter()
            .zip(&idx)
            .zip(outs.iter_mut())
            .map(|((store, indices), dst)| FixedShare { store, indices, dst })
            .collect();
        gather_fixed_shares(&mut shares, len, shards).unwrap();
        for (k, (indices, out)) in idx.iter().zip(&outs).enumerate() {
            let want: Vec<u8> =
                indices.iter().flat_map(|&i| record(k as u64 * 1000 + i, len)).collect();
            assert!(out == &want, "store {k}, {shards} shards");
        }
    }
}

#[test]
fn shares_with_a_bad_index_or_size_are_refused_before_anything_is_read() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let owned = stores(&dirs, Codec::Raw);
    let (mut first, mut second) = (vec![7u8; 48], vec![7u8; 24]);
    let mut shares = [
        FixedShare { store: &owned[0], indices: &[1, 2], dst: &mut first },
        FixedShare { store: &owned[1], indices: &[40], dst: &mut second },
    ];
    let r = gather_fixed_shares(&mut shares, 24, usize::MAX);
    assert!(matches!(r, Err(Error::IndexOutOfRange { index: 40, len: 40 })), "{r:?}");
    let mut c = vec![7u8; 30];
    let mut shares = [FixedShare { store: &owned[0], indices: &[1], dst: &mut c }];
    let r = gather_fixed_shares(&mut shares, 24, usize::MAX);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    assert!(first.iter().chain(&second).chain(&c).all(|&x| x == 7), "a refused call wrote");
    // A record of another length than asked is its store's own refusal.
    let mut d = vec![0u8; 32];
    let mut shares = [FixedShare { store: &owned[2], indices: &[0], dst: &mut d }];
    let r = gather_fixed_shares(&mut shares, 32, usize::MAX);
    assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
}
