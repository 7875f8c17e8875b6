//! Damaged stores: every kind of bad byte gives a clear error naming the file, never a panic or
//! garbage.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use zrecord::{Codec, Error, Options, Store};

fn sample_store(dir: &std::path::Path, codec: Codec) -> Vec<Vec<u8>> {
    let store = open(dir, codec);
    let recs: Vec<Vec<u8>> = (0..20).map(|i| record(i, 500 + i as usize * 10)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    store.sync().unwrap();
    recs
}

fn patch(path: &std::path::Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

fn gather_all(store: &Store) -> Result<(), Error> {
    let n = store.len();
    let idx: Vec<u64> = (0..n).collect();
    let lens = store.lengths(&idx)?;
    let mut offsets = Vec::new();
    let mut total = 0u64;
    for l in lens {
        offsets.push(total);
        total += u64::from(l);
    }
    let mut dst = vec![0u8; total as usize];
    store.gather(&idx, &mut dst, &offsets)
}

fn open_err(dir: &std::path::Path) -> Error {
    Store::open(dir, Options::default()).err().expect("open should fail")
}

#[test]
fn bad_magic_version_and_size_are_refused_on_open() {
    let dir = tempfile::tempdir().unwrap();
    sample_store(dir.path(), Codec::Raw);
    let meta = dir.path().join("meta.zr");
    patch(&meta, 0, b"ZRAC");
    let e = open_err(dir.path());
    assert!(matches!(&e, Error::Corrupt { detail, .. } if detail.contains("magic")), "{e}");
    patch(&meta, 0, b"ZREC\x04\x00");
    let e = open_err(dir.path());
    assert!(matches!(&e, Error::Corrupt { detail, .. } if detail.contains("version 4")), "{e}");
    patch(&meta, 4, &3u16.to_le_bytes());
    patch(&meta, 12, &(u32::MAX).to_le_bytes());
    assert!(matches!(open_err(dir.path()), Error::Corrupt { .. }));
    patch(&meta, 12, &20u32.to_le_bytes());
    patch(&meta, 6, &5000u16.to_le_bytes());
    assert!(matches!(open_err(dir.path()), Error::Corrupt { .. }));
    patch(&meta, 6, &0u16.to_le_bytes());
    Store::open(dir.path(), Options::default()).unwrap();
    std::fs::OpenOptions::new().write(true).open(&meta).unwrap().set_len(4096).unwrap();
    let e = open_err(dir.path());
    assert!(e.to_string().contains("meta.zr") && e.to_string().contains("4096"), "{e}");
}

#[test]
fn bad_table_entries_are_reported_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let recs = sample_store(dir.path(), Codec::Raw);
    let meta = dir.path().join("meta.zr");
    let entry = |i: u64| 16 + i * 16;
    // Offset past the end of the chunk file.
    patch(&meta, entry(3), &(1u32 << 30).to_le_bytes());
    let store = open(dir.path(), Codec::Raw);
    let e = gather_all(&store).unwrap_err();
    assert!(matches!(&e, Error::Corrupt { detail, .. } if detail.contains("record 3")), "{e}");
    // Other records still read.
    assert_eq!(read(&store, &[0, 4]), vec![recs[0].clone(), recs[4].clone()]);
    drop(store);
    patch(&meta, entry(3), &0u32.to_le_bytes());
    // Unknown codec tag.
    patch(&meta, entry(5) + 14, &[9]);
    let e = gather_all(&open(dir.path(), Codec::Raw)).unwrap_err();
    assert!(e.to_string().contains("codec tag 9"), "{e}");
    patch(&meta, entry(5) + 14, &[0]);
    // Missing chunk.
    patch(&meta, entry(6) + 12, &7u16.to_le_bytes());
    let e = gather_all(&open(dir.path(), Codec::Raw)).unwrap_err();
    assert!(e.to_string().contains("7.zr") && e.to_string().contains("missing"), "{e}");
    patch(&meta, entry(6) + 12, &0u16.to_le_bytes());
    // Raw record whose sizes disagree; logical size over 1 MiB.
    patch(&meta, entry(7) + 8, &1u32.to_le_bytes());
    assert!(matches!(gather_all(&open(dir.path(), Codec::Raw)), Err(Error::Corrupt { .. })));
    patch(&meta, entry(7) + 8, &(2u32 << 20).to_le_bytes());
    assert!(matches!(gather_all(&open(dir.path(), Codec::Raw)), Err(Error::Corrupt { .. })));
}

#[test]
fn bad_frames_and_truncated_chunks_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    sample_store(dir.path(), Codec::Zstd);
    let store = open(dir.path(), Codec::Zstd);
    let e2 = store.entry(2).unwrap();
    assert_eq!(e2.codec, Codec::Zstd as u8);
    drop(store);
    let chunk = dir.path().join("0.zr");
    patch(&chunk, u64::from(e2.offset) + 2, b"\xff\xff\xff\xff");
    let e = gather_all(&open(dir.path(), Codec::Zstd)).unwrap_err();
    assert!(
        matches!(&e, Error::Corrupt { path, detail } if path.ends_with("0.zr") && detail.contains("record 2")),
        "{e}"
    );
    // Truncating the chunk file cuts off the last records.
    let store = open(dir.path(), Codec::Zstd);
    let e19 = store.entry(19).unwrap();
    drop(store);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&chunk)
        .unwrap()
        .set_len(u64::from(e19.offset) + 1)
        .unwrap();
    let store = open(dir.path(), Codec::Zstd);
    let e = store.gather(&[19], &mut vec![0u8; 1000], &[0]).unwrap_err();
    assert!(e.to_string().contains("past the end of the file"), "{e}");
}

#[test]
fn dictionary_records_need_the_dictionary() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), Codec::ZstdDict);
        let samples: Vec<Vec<u8>> = (0..100).map(|i| record(i, 1000)).collect();
        let (buf, _) = pack(&samples);
        store.train_dict(&buf, &[1000; 100], 2048).unwrap();
        let (buf, off) = pack(&samples[..10]);
        store.append(&buf, &off, None).unwrap();
        store.sync().unwrap();
    }
    std::fs::remove_file(dir.path().join("dict.zr")).unwrap();
    let e = gather_all(&open(dir.path(), Codec::Zstd)).unwrap_err();
    assert!(matches!(e, Error::MissingDictionary { .. }), "{e}");
    // A different dictionary does not decode them either: an error, not garbage.
    std::fs::write(dir.path().join("dict.zr"), b"not the dictionary at all, just bytes").unwrap();
    let e = gather_all(&open(dir.path(), Codec::Zstd)).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn seeded_byte_flips_never_panic() {
    // A small seeded mutation loop over the header, live entries and chunk bytes; the outcome is
    // always a clean open or a clean error, and reads return data or an error.
    let base = tempfile::tempdir().unwrap();
    sample_store(base.path(), Codec::Zstd);
    let mut rng = Rng(42);
    for case in 0..300 {
        let dir = tempfile::tempdir().unwrap();
        // meta.zr is a 256 MiB sparse file: copy it as one.
        let status = std::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(base.path().join("meta.zr"))
            .arg(base.path().join("0.zr"))
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success());
        let chunk_len = std::fs::metadata(dir.path().join("0.zr")).unwrap().len();
        for _ in 0..=rng.below(4) {
            let (file, at) = match rng.below(3) {
                0 => ("meta.zr", rng.below(16)),
                1 => ("meta.zr", 16 + rng.below(20 * 16)),
                _ => ("0.zr", rng.below(chunk_len)),
            };
            patch(&dir.path().join(file), at, &[rng.next() as u8]);
        }
        if let Ok(store) = Store::open(dir.path(), Options::default()) {
            let _ = gather_all(&store);
            let _ = store.stats();
            if case % 10 == 0 {
                let _ = store.compact();
            }
        }
    }
}

#[test]
fn a_dictionary_zstd_rejects_is_a_corrupt_store_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path(), Codec::Zstd));
    // zstd's dictionary magic followed by entropy tables that do not parse.
    let mut bad = vec![0x37, 0xA4, 0x30, 0xEC, 1, 0, 0, 0];
    bad.extend(std::iter::repeat_n(0xFF, 300));
    std::fs::write(dir.path().join("dict.zr"), &bad).unwrap();
    let e = Store::open(dir.path(), Options::default()).err().expect("open must fail");
    assert!(matches!(e, Error::Corrupt { ref detail, .. } if detail.contains("dict.zr")), "{e}");
}

#[test]
fn appending_after_the_tail_chunk_vanished_or_shrank_is_refused() {
    for damage in ["removed", "truncated"] {
        let dir = tempfile::tempdir().unwrap();
        let records = sample_store(dir.path(), Codec::Raw);
        let chunk = dir.path().join("0.zr");
        match damage {
            "removed" => std::fs::remove_file(&chunk).unwrap(),
            _ => std::fs::OpenOptions::new().write(true).open(&chunk).unwrap().set_len(10).unwrap(),
        }
        let store = open(dir.path(), Codec::Raw);
        let e = store.append(&[1, 2, 3], &[0], None).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{damage}: {e}");
        assert!(e.to_string().contains("0.zr"), "{damage}: {e}");
        // Nothing was written, nothing recreated: reads still report the damage.
        assert_eq!(store.len(), records.len() as u64);
        assert_eq!(chunk.exists(), damage == "truncated");
        assert!(matches!(gather_all(&store), Err(Error::Corrupt { .. })), "{damage}");
    }
}
