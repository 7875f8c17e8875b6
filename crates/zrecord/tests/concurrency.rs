//! Many threads gathering while others append, including while an append is paused between
//! writing its data and publishing its length; exclusive operations refused while calls are in
//! flight; the cross-process writer lock.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use zrecord::failpoint::Action;
use zrecord::{Codec, Error};

/// Record `i` is fully determined by its index, so a reader can check any record it sees.
fn rec(i: u64) -> Vec<u8> {
    record(i, 64 + (i as usize * 131) % 3000)
}

#[test]
fn readers_see_only_complete_records_while_writers_append() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open_small_chunks(dir.path(), Codec::Zstd, 1 << 16));
    let first: Vec<Vec<u8>> = (0..64).map(rec).collect();
    let (buf, off) = pack(&first);
    store.append(&buf, &off, None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let appended = Arc::new(std::sync::Mutex::new(64u64));
    let mut handles = Vec::new();
    for w in 0..2 {
        let (store, stop, appended) = (store.clone(), stop.clone(), appended.clone());
        handles.push(std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) && rounds < 150 {
                // Index i must hold rec(i): reserve indices under a lock, as the writers share
                // one index space.
                let mut next = appended.lock().unwrap();
                let batch: Vec<Vec<u8>> = (*next..*next + 8).map(rec).collect();
                let (buf, off) = pack(&batch);
                let codec = if (rounds + w) % 2 == 0 { Codec::Zstd } else { Codec::Raw };
                let got = store.append(&buf, &off, Some(codec)).unwrap();
                assert_eq!(got, *next);
                *next += 8;
                drop(next);
                rounds += 1;
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..4u64 {
        let (store, stop) = (store.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = Rng(r);
            let mut checked = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = store.len();
                let idx: Vec<u64> = (0..32).map(|_| rng.below(n)).collect();
                for (i, got) in idx.iter().zip(read(&store, &idx)) {
                    assert!(got == rec(*i), "record {i} read back wrong");
                    checked += 1;
                }
            }
            checked
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let checked: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(checked > 0);
    assert_eq!(store.len(), 64 + 2 * 150 * 8);
    assert!(read_all(&store) == (0..store.len()).map(rec).collect::<Vec<_>>());
}

#[test]
fn a_paused_append_does_not_block_or_confuse_readers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path(), Codec::Zstd));
    let first: Vec<Vec<u8>> = (0..10).map(rec).collect();
    let (buf, off) = pack(&first);
    store.append(&buf, &off, None).unwrap();
    for point in ["append:before-table", "append:before-publish"] {
        store.failpoints().arm(point, Action::Pause);
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                let n = store.len();
                let batch: Vec<Vec<u8>> = (n..n + 5).map(rec).collect();
                let (buf, off) = pack(&batch);
                store.append(&buf, &off, None).unwrap()
            })
        };
        store.failpoints().wait_paused(point);
        let n = store.len();
        // Readers proceed, see only the published records, and exclusive calls are refused.
        assert!(read_all(&store) == (0..n).map(rec).collect::<Vec<_>>());
        let e = store.compact().unwrap_err();
        assert!(matches!(e, Error::Busy(ref m) if m.contains("in flight")), "{e}");
        assert!(matches!(store.delete(&[0]), Err(Error::Busy(_))));
        assert!(matches!(store.enable_checksums(), Err(Error::Busy(_))));
        assert!(!store.has_checksums());
        store.failpoints().release(point);
        assert_eq!(writer.join().unwrap(), n);
        assert_eq!(store.len(), n + 5);
        assert!(read_all(&store) == (0..n + 5).map(rec).collect::<Vec<_>>());
    }
}

#[test]
fn failed_appends_leave_the_store_unchanged_and_reusable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Zstd);
    let batch: Vec<Vec<u8>> = (0..5).map(rec).collect();
    let (buf, off) = pack(&batch);
    store.append(&buf, &off, None).unwrap();
    for point in ["append:before-data", "append:before-table", "append:before-publish"] {
        store.failpoints().arm(point, Action::FailAt(1));
        let more: Vec<Vec<u8>> = (100..103).map(rec).collect();
        let (b2, o2) = pack(&more);
        assert!(store.append(&b2, &o2, None).is_err());
        assert_eq!(store.len(), 5, "{point}");
    }
    let (b3, o3) = pack(&(5..8).map(rec).collect::<Vec<_>>());
    store.append(&b3, &o3, None).unwrap();
    store.sync().unwrap();
    drop(store);
    let store = open(dir.path(), Codec::Zstd);
    assert!(read_all(&store) == (0..8).map(rec).collect::<Vec<_>>());
}

#[test]
fn one_writer_handle_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), Codec::Raw);
    let b = open(dir.path(), Codec::Raw);
    a.append(b"hello", &[0], None).unwrap();
    let e = b.append(b"world", &[0], None).unwrap_err();
    assert!(matches!(e, Error::Busy(ref m) if m.contains("writer lock")), "{e}");
    // Readers need no lock; the second handle sees what the first synced once it reopens.
    a.sync().unwrap();
    drop(b);
    let c = open(dir.path(), Codec::Raw);
    assert_eq!(read_all(&c), vec![b"hello".to_vec()]);
    drop(a);
    c.append(b"world", &[0], None).unwrap();
    assert_eq!(c.len(), 2);
}

#[test]
fn unsynced_appends_are_invisible_to_a_new_open_synced_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let w = open(dir.path(), Codec::Zstd);
    w.append(&rec(0), &[0], None).unwrap();
    assert_eq!(open(dir.path(), Codec::Raw).len(), 0, "the header moves only on sync");
    w.sync().unwrap();
    assert_eq!(open(dir.path(), Codec::Raw).len(), 1);
}
