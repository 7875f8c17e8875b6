//! Chunk rollover with a test-sized chunk capacity: a record that does not fit starts the next
//! chunk, and a chunk filled exactly moves the frontier to the start of the next one.

mod common;
use common::*;
use zrecord::Codec;

#[test]
fn records_roll_over_and_never_straddle() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_small_chunks(dir.path(), Codec::Raw, 100);
    // 60 + 40 fills chunk 0 exactly; 30 starts chunk 1; 80 does not fit after it: chunk 2.
    let recs = vec![record(1, 60), record(2, 40), record(3, 30), record(4, 80), record(5, 0)];
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    let locs: Vec<(u16, u32)> =
        (0..5).map(|i| store.entry(i).map(|e| (e.chunk_id, e.offset)).unwrap()).collect();
    assert_eq!(locs, vec![(0, 0), (0, 60), (1, 0), (2, 0), (2, 80)]);
    let st = store.stats().unwrap();
    assert_eq!(st.chunk_bytes, 2 * 100 + 80);
    assert_eq!(st.chunks, 3);
    assert_eq!(std::fs::metadata(dir.path().join("0.zr")).unwrap().len(), 100);
    assert_eq!(std::fs::metadata(dir.path().join("1.zr")).unwrap().len(), 30);
    assert_eq!(read_all(&store), recs);

    // Filling chunk 2 exactly moves the frontier to (3, 0) without creating 3.zr.
    store.append(&record(6, 20), &[0], None).unwrap();
    store.sync().unwrap();
    let meta = std::fs::read(dir.path().join("meta.zr")).unwrap();
    assert_eq!(&meta[6..8], &3u16.to_le_bytes(), "tail_chunk");
    assert_eq!(&meta[8..12], &0u32.to_le_bytes(), "tail_offset");
    assert_eq!(&meta[12..16], &6u32.to_le_bytes(), "length");
    assert!(!dir.path().join("3.zr").exists());
    drop(store);
    let store = open_small_chunks(dir.path(), Codec::Raw, 100);
    store.append(&record(7, 10), &[0], None).unwrap();
    assert_eq!(store.entry(6).unwrap().chunk_id, 3);
}

#[test]
fn compaction_pulls_records_back_across_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_small_chunks(dir.path(), Codec::Raw, 100);
    let recs: Vec<Vec<u8>> = (0..10).map(|i| record(i, 45)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    assert_eq!(store.stats().unwrap().chunks, 5);
    store.delete(&[0, 2, 4, 6]).unwrap();
    let mut model = recs.clone();
    for i in [6, 4, 2, 0] {
        model.swap_remove(i);
    }
    let report = store.compact().unwrap();
    // Chunks 3 and 4, plus the staging chunks the moves went through.
    assert!(report.chunks_removed >= 2, "{report:?}");
    assert_eq!(report.moved, 6, "{report:?}"); // record 0 was deleted: all six live ones move
    let st = store.stats().unwrap();
    assert_eq!(st.chunks, 3);
    assert_eq!(st.chunk_bytes, 200 + 90);
    for id in 3..8 {
        assert!(!dir.path().join(format!("{id}.zr")).exists(), "{id}.zr left behind");
    }
    assert_eq!(std::fs::metadata(dir.path().join("2.zr")).unwrap().len(), 90, "tail chunk trimmed");
    assert_eq!(read_all(&store), model);
    drop(store);
    assert_eq!(read_all(&open_small_chunks(dir.path(), Codec::Raw, 100)), model);
}
