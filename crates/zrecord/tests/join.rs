//! Joining stores (`Store::join_from`): the joined store reads exactly as the parts one after
//! another, appends continue it, checksums follow their records, the parts are left as they
//! were, and what cannot be joined is refused before anything is written.

mod common;
use common::*;
use zrecord::{Codec, Error, Store};

const CAPACITY: u64 = 4096;

/// A store of `n` records tagged `tag0..tag0 + n`, of 100 to 1,300 bytes (so records roll
/// over several small chunks).
fn part(dir: &std::path::Path, codec: Codec, tag0: u64, n: u64) -> (Store, Vec<Vec<u8>>) {
    let s = open_small_chunks(dir, codec, CAPACITY);
    let recs: Vec<Vec<u8>> =
        (0..n).map(|i| record(tag0 + i, 100 + ((tag0 + i) as usize * 53) % 1200)).collect();
    if n > 0 {
        let (buf, off) = pack(&recs);
        s.append(&buf, &off, None).unwrap();
    }
    s.sync().unwrap();
    (s, recs)
}

#[test]
fn a_joined_store_reads_as_its_parts_in_order_and_appends_after_them() {
    let dirs: Vec<_> = (0..5).map(|_| tempfile::tempdir().unwrap()).collect();
    let specs =
        [(Codec::Raw, 40), (Codec::Zstd, 0), (Codec::Zstd, 33), (Codec::Raw, 1), (Codec::Zstd, 25)];
    let mut parts = Vec::new();
    let mut want = Vec::new();
    for (k, (d, &(codec, n))) in dirs.iter().zip(&specs).enumerate() {
        let (s, recs) = part(d.path(), codec, k as u64 * 1000, n);
        want.extend(recs);
        parts.push(s);
    }
    let chunk_files: Vec<usize> = dirs
        .iter()
        .map(|d| {
            std::fs::read_dir(d.path())
                .unwrap()
                .filter(|e| {
                    let n = e.as_ref().unwrap().file_name();
                    n.to_str().unwrap().trim_end_matches(".zr").parse::<u64>().is_ok()
                })
                .count()
        })
        .collect();
    assert!(chunk_files.iter().sum::<usize>() > 5, "the parts span several chunks each");
    let joined_dir = tempfile::tempdir().unwrap();
    let joined = open_small_chunks(joined_dir.path(), Codec::Zstd, CAPACITY);
    let refs: Vec<&Store> = parts.iter().collect();
    joined.join_from(&refs).unwrap();
    assert_eq!(joined.len(), want.len() as u64);
    assert!(read_all(&joined) == want);
    // The parts are untouched and still read the same.
    let mut at = 0;
    for (s, &(_, n)) in parts.iter().zip(&specs) {
        assert!(read_all(s) == want[at..at + n as usize]);
        at += n as usize;
    }
    // A fresh handle reads the same; an append continues after the last part's records.
    drop(joined);
    let again = open_small_chunks(joined_dir.path(), Codec::Zstd, CAPACITY);
    assert!(read_all(&again) == want);
    let more: Vec<Vec<u8>> = (0..30).map(|i| record(90_000 + i, 700)).collect();
    let (buf, off) = pack(&more);
    again.append(&buf, &off, None).unwrap();
    again.sync().unwrap();
    want.extend(more);
    assert!(read_all(&again) == want);
    let report = again.verify(10).unwrap();
    assert_eq!((report.records, report.failed), (want.len() as u64, 0));
    // Appending to the joined store wrote new chunk files, never into a part's.
    for (s, &(_, n)) in parts.iter().zip(&specs) {
        assert_eq!(s.len(), n);
    }
}

#[test]
fn checksums_follow_their_records() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let (a, ra) = part(dirs[0].path(), Codec::Zstd, 0, 20);
    let (b, rb) = part(dirs[1].path(), Codec::Raw, 500, 10);
    a.enable_checksums().unwrap();
    let joined_dir = tempfile::tempdir().unwrap();
    let joined = open_small_chunks(joined_dir.path(), Codec::Zstd, CAPACITY);
    joined.join_from(&[&a, &b]).unwrap();
    let report = joined.verify(10).unwrap();
    // a's 20 records are checked against their moved sums; b kept none.
    assert_eq!((report.checked, report.unchecked, report.failed), (20, 10, 0));
    assert!(read_all(&joined) == [ra, rb].concat());
}

#[test]
fn what_cannot_be_joined_is_refused_before_anything_is_written() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (a, _) = part(dirs[0].path(), Codec::Raw, 0, 10);
    let (b, _) = part(dirs[1].path(), Codec::Raw, 100, 10);
    let other = Store::open(dirs[2].path(), zrecord::Options::default()).unwrap();
    let (buf, off) = pack(&[record(1, 50)]);
    other.append(&buf, &off, None).unwrap();
    other.sync().unwrap();

    let fresh = || {
        let dst_dir = tempfile::tempdir().unwrap();
        let dst = open_small_chunks(dst_dir.path(), Codec::Raw, CAPACITY);
        (dst_dir, dst)
    };
    let chunks_in = |dst_dir: &tempfile::TempDir| {
        std::fs::read_dir(dst_dir.path())
            .unwrap()
            .filter(|entry| {
                entry.as_ref().unwrap().file_name().to_str().unwrap().starts_with(char::is_numeric)
            })
            .count()
    };
    // Another chunk capacity.
    let (dst_dir, dst) = fresh();
    let err = dst.join_from(&[&a, &other]).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("chunks of")), "{err}");
    assert_eq!((dst.len(), chunks_in(&dst_dir)), (0, 0));
    // A destination that already holds records.
    let (d2, s2) = fresh();
    let (buf, off) = pack(&[record(2, 30)]);
    s2.append(&buf, &off, None).unwrap();
    let err = s2.join_from(&[&a]).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("not empty")), "{err}");
    drop(d2);
    // A part with records appended but not synced (its header does not count them yet).
    let (buf, off) = pack(&[record(3, 30)]);
    a.append(&buf, &off, None).unwrap();
    let (dst_dir, dst) = fresh();
    let err = dst.join_from(&[&a]).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("sync it")), "{err}");
    assert_eq!(chunks_in(&dst_dir), 0);
    a.sync().unwrap();
    // A part with a dictionary of its own.
    let dict_dir = tempfile::tempdir().unwrap();
    let with_dict = open_small_chunks(dict_dir.path(), Codec::Raw, CAPACITY);
    let samples: Vec<u8> = (0..200).flat_map(|i| record(i, 1000)).collect();
    with_dict.train_dict(&samples, &[1000; 200], 4096).unwrap();
    let (dst_dir, dst) = fresh();
    let err = dst.join_from(&[&a, &with_dict]).unwrap_err();
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("dictionary")), "{err}");
    assert_eq!(chunks_in(&dst_dir), 0);
    // A part whose table names a chunk past its frontier: in the joined store it would name
    // the next part'dst bytes.
    let meta = dirs[1].path().join("meta.zr");
    let mut bytes = std::fs::read(&meta).unwrap();
    let entry = 16 + 3 * 16;
    bytes[entry + 12..entry + 14].copy_from_slice(&7u16.to_le_bytes());
    std::fs::write(&meta, &bytes).unwrap();
    let b2 = open_small_chunks(dirs[1].path(), Codec::Raw, CAPACITY);
    let (dst_dir, dst) = fresh();
    let err = dst.join_from(&[&a, &b2]).unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { detail, .. } if detail.contains("record 3 names chunk 7")),
        "{err}"
    );
    assert_eq!((dst.len(), chunks_in(&dst_dir)), (0, 0));
    drop(b);
}

#[test]
fn more_chunks_than_one_store_holds_are_refused() {
    // Chunks of 64 bytes and records of 64: one chunk per record, 4,097 in all.
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let parts: Vec<Store> = dirs
        .iter()
        .zip([2048u64, 2049])
        .map(|(d, n)| {
            let s = open_small_chunks(d.path(), Codec::Raw, 64);
            let recs: Vec<Vec<u8>> = (0..n).map(|i| record(i, 64)).collect();
            let (buf, off) = pack(&recs);
            s.append(&buf, &off, None).unwrap();
            s.sync().unwrap();
            s
        })
        .collect();
    let d = tempfile::tempdir().unwrap();
    let s = open_small_chunks(d.path(), Codec::Raw, 64);
    let refs: Vec<&Store> = parts.iter().collect();
    let e = s.join_from(&refs).unwrap_err();
    assert!(
        matches!(e, Error::LimitExceeded { what: "chunks in one store", limit: 4096, .. }),
        "{e}"
    );
    assert_eq!(s.len(), 0);
}
