//! Reads over several stores in one call (`zrecord::across`): the same bytes as reading each
//! store alone, records of any store in any batch order, and bad part numbers refused.

mod common;
use common::*;
use zrecord::across::{gather_across, gather_fixed_across, lengths_across};
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
    for codec in [Codec::Raw, Codec::Zstd] {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let owned = stores(&dirs, codec);
        let refs: Vec<&Store> = owned.iter().collect();
        let mut rng = Rng(7);
        let parts: Vec<u32> = (0..200).map(|_| rng.below(3) as u32).collect();
        let idx: Vec<u64> = (0..200).map(|_| rng.below(40)).collect();
        let want: Vec<u8> = parts
            .iter()
            .zip(&idx)
            .flat_map(|(&p, &i)| record(u64::from(p) * 1000 + i, 24))
            .collect();
        let mut got = vec![0u8; 200 * 24];
        gather_fixed_across(&refs, &parts, &idx, None, &mut got, 24, usize::MAX).unwrap();
        assert!(got == want, "fixed ({codec:?})");
        // Into every other row of a larger buffer; rows between stay untouched.
        let rows: Vec<u64> = (0..200).map(|i| 2 * i).collect();
        let mut spread = vec![0xAAu8; 400 * 24];
        gather_fixed_across(&refs, &parts, &idx, Some(&rows), &mut spread, 24, 1).unwrap();
        for i in 0..200 {
            assert!(spread[2 * i * 24..(2 * i + 1) * 24] == want[i * 24..(i + 1) * 24]);
            assert!(spread[(2 * i + 1) * 24..(2 * i + 2) * 24].iter().all(|&b| b == 0xAA));
        }
        // Back to back at offsets, as a ragged read lays them out (here in reverse).
        let offsets: Vec<u64> = (0..200).map(|i| (199 - i) * 24).collect();
        let mut at = vec![0u8; 200 * 24];
        gather_across(&refs, &parts, &idx, &mut at, &offsets).unwrap();
        for i in 0..200 {
            let o = (199 - i) * 24;
            assert!(at[o..o + 24] == want[i * 24..(i + 1) * 24]);
        }
        assert_eq!(lengths_across(&refs, &parts, &idx).unwrap(), vec![24; 200]);
    }
}

#[test]
fn bad_part_numbers_and_indices_are_refused() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let owned = stores(&dirs, Codec::Raw);
    let refs: Vec<&Store> = owned.iter().collect();
    let mut dst = vec![0u8; 2 * 24];
    let bad = gather_fixed_across(&refs, &[0, 2], &[1, 1], None, &mut dst, 24, 1);
    assert!(matches!(bad, Err(Error::InvalidArgument(m)) if m.contains("part number 2")));
    let short = gather_fixed_across(&refs, &[0], &[1, 1], None, &mut dst, 24, 1);
    assert!(matches!(short, Err(Error::InvalidArgument(_))));
    let past = lengths_across(&refs, &[1], &[40]);
    assert!(matches!(past, Err(Error::IndexOutOfRange { index: 40, len: 40 })));
}
