//! The record-count limit, reached by filling a store with 2^24 empty records, and the chunk
//! limit with a test-sized chunk capacity. Both are refused before anything is written.

mod common;
use common::*;
use zrecord::format::{MAX_CHUNKS, MAX_RECORDS};
use zrecord::{Codec, Error};

#[test]
fn store_full_at_two_to_the_24_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Raw);
    let batch = 1 << 20;
    let offsets = vec![0u64; batch];
    for _ in 0..(MAX_RECORDS as usize / batch) {
        store.append(&[], &offsets, None).unwrap();
    }
    assert_eq!(store.len(), MAX_RECORDS);
    let e = store.append(b"x", &[0], None).unwrap_err();
    assert!(
        matches!(e, Error::LimitExceeded { what: "record count", limit, requested } if limit == MAX_RECORDS && requested == MAX_RECORDS + 1),
        "{e}"
    );
    assert_eq!(store.len(), MAX_RECORDS);
    assert_eq!(store.stats().unwrap().chunk_bytes, 0, "nothing written");
    // Deleting makes room again.
    store.delete(&[0]).unwrap();
    store.append(b"x", &[0], None).unwrap();
    assert_eq!(read(&store, &[MAX_RECORDS - 1]), vec![b"x".to_vec()]);
}

#[test]
fn chunk_limit_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_small_chunks(dir.path(), Codec::Raw, 8);
    // Each 5-byte record takes a chunk of its own: 4096 records fill every chunk.
    let n = MAX_CHUNKS as usize;
    let buf = vec![7u8; 5 * n];
    let offsets: Vec<u64> = (0..n as u64).map(|i| i * 5).collect();
    store.append(&buf, &offsets, None).unwrap();
    let e = store.append(&[1, 2, 3, 4, 5], &[0], None).unwrap_err();
    assert!(matches!(e, Error::LimitExceeded { what: "chunk count", .. }), "{e}");
    assert_eq!(store.len(), n as u64);
    // An empty record needs no space and still fits.
    store.append(&[], &[0], None).unwrap();
}
