//! Record checksums (`sums.zr`): what they catch, that appends, deletes and compaction keep them
//! current, and that records changed by a writer that does not keep them read as unchecked,
//! never as damaged.

mod common;
use std::os::unix::fs::FileExt;

use common::*;
use zrecord::{Codec, Error, Options, Store};

fn patch(path: &std::path::Path, at: u64, f: impl Fn(u8) -> u8) {
    let file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[f(b[0])], at).unwrap();
}

/// 30 raw records then 30 zstd records; returns them.
fn mixed(store: &Store) -> Vec<Vec<u8>> {
    let raw: Vec<Vec<u8>> = (0..30).map(|i| record(i, 200 + i as usize)).collect();
    let (buf, off) = pack(&raw);
    store.append(&buf, &off, Some(Codec::Raw)).unwrap();
    let z: Vec<Vec<u8>> = (30..60).map(|i| record(i, 900)).collect();
    let (buf, off) = pack(&z);
    store.append(&buf, &off, Some(Codec::Zstd)).unwrap();
    raw.into_iter().chain(z).collect()
}

#[test]
fn enabling_sums_existing_records_and_later_appends() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Zstd);
    let mut recs = mixed(&store);
    assert!(!store.has_checksums());
    let r = store.verify(usize::MAX).unwrap();
    assert_eq!((r.records, r.checked, r.unchecked, r.failures.len()), (60, 0, 60, 0));
    assert_eq!(store.enable_checksums().unwrap(), 60);
    assert_eq!(store.enable_checksums().unwrap(), 0, "enabling twice is a no-op");
    recs.extend(mixed(&store));
    store.close().unwrap();
    drop(store);
    let store = open(dir.path(), Codec::Zstd);
    assert!(store.has_checksums());
    let r = store.verify(usize::MAX).unwrap();
    assert_eq!((r.records, r.checked, r.unchecked), (120, 120, 0));
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert!(read_all(&store) == recs);
}

#[test]
fn a_changed_raw_byte_is_caught_by_verify_and_by_checked_reads() {
    let dir = tempfile::tempdir().unwrap();
    let recs = {
        let store = open(dir.path(), Codec::Raw);
        store.enable_checksums().unwrap();
        let recs = mixed(&store);
        store.close().unwrap();
        recs
    };
    let store = open(dir.path(), Codec::Raw);
    let loc = store.entry(7).unwrap();
    patch(&dir.path().join("0.zr"), u64::from(loc.offset) + 5, |b| b ^ 0x10);
    // Without checking, a raw record's damage is invisible: the bytes simply differ.
    let got = read(&store, &[7])[0].clone();
    assert!(got != recs[7] && got.len() == recs[7].len());
    let r = store.verify(usize::MAX).unwrap();
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert_eq!(r.failures[0].0, 7);
    assert!(r.failures[0].1.contains("checksum"), "{}", r.failures[0].1);
    store.set_verify_reads(true);
    let mut dst = vec![0u8; recs[7].len()];
    let e = store.gather(&[7], &mut dst, &[0]).unwrap_err();
    assert!(matches!(&e, Error::Corrupt { .. }) && e.to_string().contains("record 7"), "{e}");
    // Other records still read, checked.
    assert!(read(&store, &[6, 8]) == vec![recs[6].clone(), recs[8].clone()]);
}

#[test]
fn zstd_frames_carry_their_own_checksum_once_sums_are_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Zstd);
    store.enable_checksums().unwrap();
    let recs = mixed(&store);
    store.close().unwrap();
    // Flip a byte in the middle of a zstd frame: even an unchecked read refuses it.
    let loc = store.entry(40).unwrap();
    assert_eq!(loc.codec, Codec::Zstd as u8);
    let mid = u64::from(loc.offset) + u64::from(loc.phys_length) / 2;
    patch(&dir.path().join("0.zr"), mid, |b| b.wrapping_add(1));
    drop(store);
    let store = open(dir.path(), Codec::Zstd);
    let mut dst = vec![0u8; recs[40].len()];
    assert!(matches!(store.gather(&[40], &mut dst, &[0]), Err(Error::Corrupt { .. })));
    let r = store.verify(usize::MAX).unwrap();
    assert_eq!(r.failures.iter().map(|f| f.0).collect::<Vec<_>>(), vec![40]);
}

#[test]
fn delete_and_compaction_keep_checksums_bound() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_small_chunks(dir.path(), Codec::Zstd, 8192);
    store.enable_checksums().unwrap();
    let mut model = mixed(&store);
    model.extend(mixed(&store));
    let targets: Vec<u64> = (0..120).filter(|i| i % 4 == 1).collect();
    store.delete(&targets).unwrap();
    for &t in targets.iter().rev() {
        model.swap_remove(t as usize);
    }
    assert!(store.compact().unwrap().moved > 0);
    let r = store.verify(usize::MAX).unwrap();
    assert_eq!((r.checked, r.unchecked, r.failures.len()), (model.len() as u64, 0, 0));
    store.set_verify_reads(true);
    assert!(read_all(&store) == model);
}

/// A writer that does not keep checksums (the reference, or this build before they were
/// enabled) changes the store behind an old `sums.zr`: the records it moved or added are
/// unchecked, none is reported damaged.
#[test]
fn records_changed_without_the_checksum_file_are_unchecked_not_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    {
        let store = open_small_chunks(path, Codec::Zstd, 8192);
        store.enable_checksums().unwrap();
        mixed(&store);
        mixed(&store);
    }
    std::fs::rename(path.join("sums.zr"), dir.path().join("../sums.zr.aside")).unwrap();
    let model = {
        let store = open_small_chunks(path, Codec::Zstd, 8192);
        let mut model = read_all(&store);
        let targets = [3u64, 50, 77, 100];
        store.delete(&targets).unwrap();
        for &t in targets.iter().rev() {
            model.swap_remove(t as usize);
        }
        store.compact().unwrap();
        let more = mixed(&store);
        model.extend(more);
        model
    };
    std::fs::rename(dir.path().join("../sums.zr.aside"), path.join("sums.zr")).unwrap();
    let store = open_small_chunks(path, Codec::Zstd, 8192);
    let r = store.verify(usize::MAX).unwrap();
    assert!(r.failures.is_empty(), "{:?}", &r.failures[..r.failures.len().min(3)]);
    assert!(r.unchecked >= 60 && r.checked > 0, "{r:?}");
    store.set_verify_reads(true);
    assert!(read_all(&store) == model);
}

#[test]
fn a_damaged_checksum_file_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), Codec::Zstd);
        store.enable_checksums().unwrap();
        mixed(&store);
    }
    patch(&dir.path().join("sums.zr"), 0, |_| b'X');
    let e = Store::open(dir.path(), Options::default()).err().expect("opened");
    assert!(matches!(&e, Error::Corrupt { .. }) && e.to_string().contains("sums.zr"), "{e}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("sums.zr"))
        .unwrap()
        .set_len(100)
        .unwrap();
    let e = Store::open(dir.path(), Options::default()).err().expect("opened");
    assert!(e.to_string().contains("sums.zr"), "{e}");
}
