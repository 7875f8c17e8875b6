//! Round trips through append and gather for every codec and record sizes from 0 bytes to
//! exactly 1 MiB, reopening the store in between.

mod common;
use common::*;
use zrecord::{Codec, Error, Options, Store};

const SIZES: &[usize] = &[0, 1, 2, 3, 15, 16, 17, 255, 4096, 12 * 1024, 65_537, 1 << 20];

fn round_trip(codec: Codec) {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Vec<u8>> =
        SIZES.iter().enumerate().map(|(i, &n)| record(i as u64, n)).collect();
    {
        let store = open(dir.path(), codec);
        if codec == Codec::ZstdDict {
            let samples: Vec<Vec<u8>> = (0..200).map(|i| record(1000 + i, 2048)).collect();
            let (buf, _) = pack(&samples);
            let sizes: Vec<usize> = samples.iter().map(std::vec::Vec::len).collect();
            let n = store.train_dict(&buf, &sizes, 4096).unwrap();
            assert!(n > 0 && n <= 4096);
        }
        let (buf, offsets) = pack(&records);
        assert_eq!(store.append(&buf, &offsets, None).unwrap(), 0);
        assert_eq!(read_all(&store), records);
        store.sync().unwrap();
    }
    let store = open(dir.path(), Codec::Raw);
    assert_eq!(store.len(), records.len() as u64);
    assert_eq!(read_all(&store), records, "after reopen");
    let stats = store.stats().unwrap();
    assert_eq!(stats.records, records.len() as u64);
    assert_eq!(stats.logical_bytes, SIZES.iter().sum::<usize>() as u64);
    if codec == Codec::Raw {
        assert_eq!(stats.compressed_records, 0);
        assert_eq!(stats.live_bytes, stats.logical_bytes);
    } else {
        // The compressible records shrink; the tiny ones cannot and are stored raw.
        for (i, &n) in SIZES.iter().enumerate() {
            let codec_tag = store.entry(i as u64).unwrap().codec;
            if n >= 255 {
                assert_eq!(codec_tag, codec as u8, "record of {n} bytes should be compressed");
            }
            if n < 2 {
                assert_eq!(codec_tag, Codec::Raw as u8);
            }
        }
        assert!(stats.live_bytes < stats.logical_bytes);
    }
}

#[test]
fn raw_round_trip() {
    round_trip(Codec::Raw);
}

#[test]
fn zstd_round_trip() {
    round_trip(Codec::Zstd);
}

#[test]
fn zstd_dict_round_trip() {
    round_trip(Codec::ZstdDict);
}

#[test]
fn incompressible_records_are_stored_raw() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Zstd);
    let mut rng = Rng(5);
    let noise: Vec<u8> = (0..10_000).map(|_| rng.next() as u8).collect();
    store.append(&noise, &[0], None).unwrap();
    let e = store.entry(0).unwrap();
    assert_eq!(e.codec, Codec::Raw as u8);
    assert_eq!(e.phys_length, 10_000);
    assert_eq!(read_all(&store), vec![noise]);
}

#[test]
fn codec_per_call_and_scattered_destination() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Raw);
    let a: Vec<Vec<u8>> = (0..50).map(|i| record(i, 300 + i as usize)).collect();
    let (buf, off) = pack(&a);
    store.append(&buf, &off, Some(Codec::Zstd)).unwrap();
    store.append(&buf, &off, Some(Codec::Raw)).unwrap();
    assert_eq!(store.entry(0).unwrap().codec, Codec::Zstd as u8);
    assert_eq!(store.entry(50).unwrap().codec, Codec::Raw as u8);
    // Reverse order, with gaps between destination ranges.
    let idx: Vec<u64> = (0..100).rev().collect();
    let mut offsets = Vec::new();
    let mut at = 0u64;
    for &i in &idx {
        offsets.push(at);
        at += a[(i % 50) as usize].len() as u64 + 3;
    }
    let mut dst = vec![0xAAu8; at as usize];
    store.gather(&idx, &mut dst, &offsets).unwrap();
    for (k, &i) in idx.iter().enumerate() {
        let r = &a[(i % 50) as usize];
        let o = offsets[k] as usize;
        assert_eq!(&dst[o..o + r.len()], &r[..]);
        assert_eq!(&dst[o + r.len()..o + r.len() + 3], &[0xAA; 3], "gap bytes untouched");
    }
}

#[test]
fn bad_gathers_are_refused_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Raw);
    let recs = vec![record(1, 10), record(2, 10)];
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    let mut dst = vec![7u8; 20];
    let e = store.gather(&[0, 1], &mut dst, &[0, 5]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("overlap")), "{e}");
    let e = store.gather(&[0, 1], &mut dst, &[0, 11]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("too small")), "{e}");
    let e = store.gather(&[0, 2], &mut dst, &[0, 10]).unwrap_err();
    assert!(matches!(e, Error::IndexOutOfRange { index: 2, len: 2 }), "{e}");
    let e = store.gather(&[0], &mut dst, &[0, 10]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(dst, vec![7u8; 20], "refused gathers write nothing");
    assert!(matches!(store.lengths(&[5]), Err(Error::IndexOutOfRange { .. })));
}

#[test]
fn bad_appends_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Zstd);
    let big = vec![0u8; (1 << 20) + 1];
    let e = store.append(&big, &[0], None).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { limit, .. } if limit == 1 << 20), "{e}");
    let e = store.append(&[1, 2, 3], &[2, 1], None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = store.append(&[1, 2, 3], &[4], None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = store.append(&[1, 2, 3], &[0], Some(Codec::ZstdDict)).unwrap_err();
    assert!(matches!(e, Error::MissingDictionary { .. }), "{e}");
    assert_eq!(store.len(), 0);
    assert_eq!(store.append(&[], &[], None).unwrap(), 0, "an empty batch is a no-op");
    assert_eq!(store.stats().unwrap().chunk_bytes, 0);
}

#[test]
fn open_creates_missing_directories_and_refuses_files() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b/c");
    let store = open(&nested, Codec::Raw);
    assert!(store.is_empty());
    assert_eq!(std::fs::metadata(nested.join("meta.zr")).unwrap().len(), 16 + (1 << 24) * 16);
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let e = Store::open(&file, Options::default()).err().unwrap();
    assert!(matches!(e, Error::Io { .. }), "{e}");
}

#[test]
fn dictionary_is_trained_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::ZstdDict);
    let samples: Vec<Vec<u8>> = (0..100).map(|i| record(i, 1000)).collect();
    let (buf, _) = pack(&samples);
    let sizes = vec![1000usize; 100];
    store.train_dict(&buf, &sizes, 2048).unwrap();
    assert!(store.has_dict());
    let e = store.train_dict(&buf, &sizes, 2048).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("already")), "{e}");
    let e = store.train_dict(&buf, &[5], 2048).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    drop(store);
    assert!(open(dir.path(), Codec::Raw).has_dict(), "dict.zr is loaded on open");
}

#[test]
fn fixed_stride_gather_matches_records_and_checks_lengths() {
    for codec in [Codec::Raw, Codec::Zstd] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), codec);
        let recs: Vec<Vec<u8>> = (0..300).map(|t| record(t, 12 * 1024)).collect();
        let (buf, off) = pack(&recs);
        store.append(&buf, &off, None).unwrap();
        let mut rng = Rng(9);
        let idx: Vec<u64> = (0..256).map(|_| rng.below(300)).collect();
        let mut dst = vec![0u8; idx.len() * 12 * 1024];
        store.gather_fixed(&idx, &mut dst, 12 * 1024, usize::MAX).unwrap();
        let mut inline = vec![0u8; dst.len()];
        store.gather_fixed(&idx, &mut inline, 12 * 1024, 1).unwrap();
        assert_eq!(inline, dst);
        for (row, &i) in dst.chunks_exact(12 * 1024).zip(&idx) {
            assert_eq!(row, &recs[i as usize][..]);
        }
        // A record of another size in a fixed-stride gather is a corrupt dataset, and nothing
        // is written; so are a wrong destination size and an index past the end.
        store.append(&[1, 2, 3], &[0], None).unwrap();
        let mut dst = vec![5u8; 2 * 12 * 1024];
        let e = store.gather_fixed(&[0, 300], &mut dst, 12 * 1024, 2).unwrap_err();
        assert!(matches!(e, Error::Corrupt { ref detail, .. } if detail.contains("record 300")));
        let e = store.gather_fixed(&[0], &mut dst, 12 * 1024, 2).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let e = store.gather_fixed(&[0, 301], &mut dst, 12 * 1024, 2).unwrap_err();
        assert!(matches!(e, Error::IndexOutOfRange { index: 301, len: 301 }), "{e}");
        assert!(dst.iter().all(|&b| b == 5));
    }
}

/// Empty records sitting past the data compaction packs away must follow the packing: left at
/// their old place they lay past the new frontier and the store no longer opened (found by the
/// list model, crates/zrecord/tests/model.rs).
#[test]
fn compaction_moves_empty_records_below_the_new_frontier() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Raw);
    let src = vec![7u8; 693];
    // Record 1 holds 693 bytes; records 2..8 are empty and sit at offset 693.
    let offsets = [0u64, 0, 693, 693, 693, 693, 693, 693];
    store.append(&src, &offsets, None).unwrap();
    store.delete(&[1]).unwrap();
    store.compact().unwrap();
    store.sync().unwrap();
    drop(store);
    let store = open(dir.path(), Codec::Raw);
    assert_eq!(store.len(), 7);
    assert!(store.lengths(&(0..7).collect::<Vec<_>>()).unwrap().iter().all(|&n| n == 0));
    let report = store.verify(usize::MAX).unwrap();
    assert!(report.failures.is_empty());
}

/// The fixed-stride gather into chosen rows fills exactly those rows, and refuses rows that
/// are not strictly increasing or fall outside the destination without writing anything.
#[test]
fn fixed_stride_gather_into_chosen_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Zstd);
    let recs: Vec<Vec<u8>> = (0..40).map(|t| record(t, 1000)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    let mut dst = vec![9u8; 6 * 1000];
    store.gather_fixed_at(&[31, 2, 17], Some(&[0, 3, 5]), &mut dst, 1000, usize::MAX).unwrap();
    for (row, want) in dst.chunks_exact(1000).enumerate() {
        match row {
            0 => assert_eq!(want, &recs[31][..]),
            3 => assert_eq!(want, &recs[2][..]),
            5 => assert_eq!(want, &recs[17][..]),
            _ => assert!(want.iter().all(|&b| b == 9), "row {row} untouched"),
        }
    }
    let mut dst = vec![9u8; 6 * 1000];
    for rows in [&[3u64, 3][..], &[4, 1], &[0, 6], &[0]] {
        let e = store.gather_fixed_at(&[1, 2], Some(rows), &mut dst, 1000, 1).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{rows:?}: {e}");
    }
    let e = store.gather_fixed_at(&[1], Some(&[0]), &mut dst[..5500], 1000, 1).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(dst.iter().all(|&b| b == 9));
}
