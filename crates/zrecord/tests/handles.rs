//! Several handles on one store, as several processes would hold them (each handle has its own
//! maps, files and writer lock): writers start from what is on disk, readers follow synced
//! appends live, a delete elsewhere is refused until the reader accepts it, and compaction
//! elsewhere (moves, removed and recreated chunk files) is followed exactly.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use zrecord::failpoint::Action;
use zrecord::{Codec, Error, Store};

/// A record that names itself: its tag, then bytes derived from the tag. Indices change under
/// deletes, so readers check records by what they say they are.
fn tagged(tag: u64) -> Vec<u8> {
    let mut r = tag.to_le_bytes().to_vec();
    r.extend(record(tag, 50 + (tag as usize * 97) % 900));
    r
}

fn check_tagged(r: &[u8]) -> Result<u64, String> {
    let tag = u64::from_le_bytes(r.get(..8).ok_or("short record")?.try_into().unwrap());
    if r == tagged(tag).as_slice() {
        Ok(tag)
    } else {
        Err(format!("record claiming tag {tag} is damaged"))
    }
}

fn append_tags(store: &Store, tags: std::ops::Range<u64>) -> u64 {
    let recs: Vec<Vec<u8>> = tags.map(tagged).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap()
}

fn tags_of(store: &Store) -> Vec<u64> {
    read_all(store).iter().map(|r| check_tagged(r).unwrap()).collect()
}

#[test]
fn a_handle_opened_before_another_wrote_appends_after_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let early = open(dir.path(), Codec::Zstd);
    let other = open(dir.path(), Codec::Raw);
    append_tags(&other, 0..10);
    other.close().unwrap();
    // The early handle never saw those records at open; its first write reads the store anew.
    assert_eq!(append_tags(&early, 10..15), 10);
    early.close().unwrap();
    assert_eq!(tags_of(&open(dir.path(), Codec::Raw)), (0..15).collect::<Vec<_>>());
}

#[test]
fn a_handle_opened_before_another_deleted_and_compacted_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let early = open_small_chunks(dir.path(), Codec::Raw, 4096);
    let other = open_small_chunks(dir.path(), Codec::Raw, 4096);
    append_tags(&other, 0..40);
    other.sync().unwrap();
    let _ = early.len(); // the early handle now sees those 40 records
    other.delete(&(0..30).collect::<Vec<_>>()).unwrap();
    other.compact().unwrap();
    other.close().unwrap();
    let survivors = tags_of(&open_small_chunks(dir.path(), Codec::Raw, 4096));
    assert_eq!(survivors.len(), 10);
    // Deleted since this handle opened: its view is stale, so writing is refused until it
    // accepts the new state; then it appends after the survivors.
    let e = append_tags_err(&early, 100..105);
    assert!(matches!(e, Error::Changed(_)), "{e}");
    early.refresh().unwrap();
    assert_eq!(append_tags(&early, 100..105), 10);
    early.close().unwrap();
    let mut want = survivors;
    want.extend(100..105);
    assert_eq!(tags_of(&open_small_chunks(dir.path(), Codec::Raw, 4096)), want);
}

fn append_tags_err(store: &Store, tags: std::ops::Range<u64>) -> Error {
    let recs: Vec<Vec<u8>> = tags.map(tagged).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap_err()
}

#[test]
fn readers_follow_synced_appends_live() {
    let dir = tempfile::tempdir().unwrap();
    let writer = open(dir.path(), Codec::Zstd);
    let reader = open(dir.path(), Codec::Raw);
    append_tags(&writer, 0..5);
    assert_eq!((writer.len(), reader.len()), (5, 0), "unsynced appends stay the writer's");
    writer.sync().unwrap();
    assert_eq!(reader.len(), 5);
    assert_eq!(tags_of(&reader), (0..5).collect::<Vec<_>>());
    assert!(writer.is_writer() && !reader.is_writer());
}

#[test]
fn a_delete_elsewhere_fails_reads_until_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let writer = open(dir.path(), Codec::Zstd);
    append_tags(&writer, 0..20);
    writer.sync().unwrap();
    let reader = open(dir.path(), Codec::Raw);
    assert_eq!(tags_of(&reader).len(), 20);
    writer.delete(&[3, 7]).unwrap();
    let mut dst = vec![0u8; 4096];
    let e = reader.gather(&[3], &mut dst, &[0]).unwrap_err();
    assert!(matches!(e, Error::Changed(_)), "{e}");
    assert!(matches!(reader.lengths(&[0]).unwrap_err(), Error::Changed(_)));
    assert!(matches!(reader.gather_fixed(&[0], &mut [], 0, 1).unwrap_err(), Error::Changed(_)));
    reader.refresh().unwrap();
    assert_eq!(tags_of(&reader), tags_of(&writer));
    // The writer's own view never goes stale.
    assert_eq!(tags_of(&writer).len(), 18);
}

#[test]
fn compaction_elsewhere_is_followed_exactly_even_when_chunk_files_are_remade() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 8192;
    let writer = open_small_chunks(dir.path(), Codec::Raw, cap);
    append_tags(&writer, 0..60); // several chunks
    writer.sync().unwrap();
    let reader = open_small_chunks(dir.path(), Codec::Raw, cap);
    assert_eq!(tags_of(&reader).len(), 60); // opens (and maps) every chunk
    writer.delete(&(0..50).collect::<Vec<_>>()).unwrap();
    reader.refresh().unwrap();
    let report = writer.compact().unwrap();
    assert!(report.chunks_removed > 0, "{report:?}");
    // Moves only: no refresh needed.
    assert_eq!(tags_of(&reader), tags_of(&writer));
    // New records land in chunk files of the removed names; the reader must not read the
    // removed files it still has mapped.
    append_tags(&writer, 1000..1060);
    writer.sync().unwrap();
    assert_eq!(tags_of(&reader), tags_of(&writer));
}

#[test]
fn readers_on_other_handles_stay_correct_while_a_writer_deletes_compacts_and_appends() {
    let dir = tempfile::tempdir().unwrap();
    let cap = 1 << 16;
    let writer = Arc::new(open_small_chunks(dir.path(), Codec::Zstd, cap));
    append_tags(&writer, 0..400);
    writer.sync().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let verified = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for seed in 0..3u64 {
        let reader = open_small_chunks(dir.path(), Codec::Raw, cap);
        let (stop, verified) = (stop.clone(), verified.clone());
        readers.push(std::thread::spawn(move || {
            let mut rng = Rng(seed);
            let mut refreshes = 0u64;
            // At least one pass after the writer stopped, so every reader reads something.
            let mut last_pass = false;
            loop {
                let n = reader.len();
                let idx: Vec<u64> = (0..32).map(|_| rng.below(n.max(1))).collect();
                match reader.lengths(&idx).and_then(|lens| {
                    let total: u64 = lens.iter().map(|&l| u64::from(l)).sum();
                    let mut offs = Vec::new();
                    let mut at = 0;
                    for &l in &lens {
                        offs.push(at);
                        at += u64::from(l);
                    }
                    let mut dst = vec![0u8; total as usize];
                    reader.gather(&idx, &mut dst, &offs).map(|()| (dst, offs, lens))
                }) {
                    Ok((dst, offs, lens)) => {
                        for (o, l) in offs.iter().zip(&lens) {
                            let r = &dst[*o as usize..(*o + u64::from(*l)) as usize];
                            check_tagged(r).unwrap();
                            verified.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(Error::Changed(_)) => {
                        reader.refresh().unwrap();
                        refreshes += 1;
                    }
                    Err(Error::IndexOutOfRange { .. }) => {} // the length shrank since len()
                    Err(e) => panic!("reader failed: {e}"),
                }
                if last_pass {
                    return refreshes;
                }
                last_pass = stop.load(Ordering::Acquire);
            }
        }));
    }
    let mut rng = Rng(99);
    let mut next = 400;
    for round in 0..30 {
        let n = writer.len();
        let victims: Vec<u64> = (0..20).map(|_| rng.below(n)).collect();
        writer.delete(&victims).unwrap();
        if round % 3 == 0 {
            writer.compact().unwrap();
        }
        append_tags(&writer, next..next + 15);
        next += 15;
        writer.sync().unwrap();
    }
    stop.store(true, Ordering::Release);
    let refreshes: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(verified.load(Ordering::Relaxed) > 0);
    assert!(refreshes > 0, "30 deletes and no reader noticed one");
    assert!(tags_of(&writer).len() as u64 == writer.len());
}

#[test]
fn a_retired_store_takes_no_writer_and_fails_reads() {
    let dir = tempfile::tempdir().unwrap();
    let old = open(dir.path(), Codec::Raw);
    append_tags(&old, 0..3);
    old.close().unwrap();
    let reader = open(dir.path(), Codec::Raw);
    let replacer = open(dir.path(), Codec::Raw);
    replacer.retire().unwrap();
    replacer.close().unwrap();
    assert!(matches!(reader.lengths(&[0]).unwrap_err(), Error::Changed(_)));
    reader.refresh().unwrap();
    let e = append_tags_err(&reader, 3..4);
    assert!(matches!(e, Error::Changed(ref m) if m.contains("replaced")), "{e}");
}

#[test]
fn the_writer_lock_is_refused_to_a_second_handle_and_released_by_close() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path(), Codec::Raw);
    let b = open(dir.path(), Codec::Raw);
    a.lock_for_writing().unwrap();
    assert!(matches!(b.lock_for_writing().unwrap_err(), Error::Busy(_)));
    a.close().unwrap();
    assert!(!a.is_writer());
    b.lock_for_writing().unwrap();
    assert!(matches!(a.lock_for_writing().unwrap_err(), Error::Busy(_)));
}

#[test]
fn a_store_replaced_under_its_name_is_not_locked_through_the_old_handle() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("s");
    let old = open(&path, Codec::Raw);
    std::fs::rename(&path, root.path().join("aside")).unwrap();
    let new = open(&path, Codec::Raw);
    append_tags(&new, 0..2);
    new.close().unwrap();
    let e = old.lock_for_writing().unwrap_err();
    assert!(matches!(e, Error::Changed(_)), "{e}");
    assert_eq!(tags_of(&open(&path, Codec::Raw)), vec![0, 1]);
}

#[test]
fn deleting_records_no_other_handle_has_seen_leaves_other_views_valid() {
    let dir = tempfile::tempdir().unwrap();
    let writer = open(dir.path(), Codec::Raw);
    append_tags(&writer, 0..10);
    writer.sync().unwrap();
    let reader = open(dir.path(), Codec::Raw);
    append_tags(&writer, 10..20);
    writer.delete(&(12..20).collect::<Vec<_>>()).unwrap(); // unsynced records only
    assert_eq!(tags_of(&reader), (0..12).collect::<Vec<_>>(), "delete syncs the header");
    writer.delete(&[0]).unwrap(); // a record the reader has seen
    assert!(matches!(reader.lengths(&[0]).unwrap_err(), Error::Changed(_)));
}

#[test]
fn a_delete_under_way_elsewhere_is_never_seen_half_done() {
    let dir = tempfile::tempdir().unwrap();
    let writer = Arc::new(open(dir.path(), Codec::Raw));
    append_tags(&writer, 0..30);
    writer.sync().unwrap();
    let reader = Arc::new(open(dir.path(), Codec::Raw));
    assert_eq!(tags_of(&reader).len(), 30);
    writer.failpoints().arm("delete:swapped", Action::Pause);
    let deleting = {
        let writer = writer.clone();
        std::thread::spawn(move || writer.delete(&[2, 5, 9]).unwrap())
    };
    writer.failpoints().wait_paused("delete:swapped");
    // One hole is filled, the length is still the old one: reads must not go on.
    assert!(matches!(reader.lengths(&[0]).unwrap_err(), Error::Changed(_)));
    // A handle opening now waits for the delete rather than take a half-applied table.
    let late = {
        let dir = dir.path().to_path_buf();
        std::thread::spawn(move || tags_of(&open(&dir, Codec::Raw)))
    };
    let refreshed = {
        let reader = reader.clone();
        std::thread::spawn(move || {
            reader.refresh().unwrap();
            tags_of(&reader)
        })
    };
    writer.failpoints().disarm("delete:swapped");
    writer.failpoints().release("delete:swapped");
    deleting.join().unwrap();
    let want = tags_of(&writer);
    assert_eq!(want.len(), 27);
    assert_eq!(refreshed.join().unwrap(), want);
    assert_eq!(late.join().unwrap(), want);
}

#[test]
fn a_delete_killed_half_way_is_settled_by_the_next_writable_open() {
    let dir = tempfile::tempdir().unwrap();
    let writer = open(dir.path(), Codec::Raw);
    append_tags(&writer, 0..10);
    writer.close().unwrap();
    let gen = dir.path().join("gen.zr");
    let set_epoch = |epoch: u64| {
        let mut bytes = std::fs::read(&gen).unwrap();
        bytes[8..16].copy_from_slice(&epoch.to_le_bytes());
        std::fs::write(&gen, &bytes).unwrap();
    };
    // What a deleter killed between its two announcements leaves: an odd change count. A
    // handle that was open meanwhile must refresh; refreshing settles it (nobody holds the
    // writer lock, so no delete is under way) instead of waiting for it.
    set_epoch(1 << 32);
    assert!(matches!(writer.lengths(&[0]).unwrap_err(), Error::Changed(_)));
    writer.refresh().unwrap();
    assert_eq!(tags_of(&writer), (0..10).collect::<Vec<_>>());
    drop(writer);
    // A handle opening then settles it too.
    set_epoch(3 << 32);
    let reader = open(dir.path(), Codec::Raw);
    assert_eq!(tags_of(&reader), (0..10).collect::<Vec<_>>());
    let settled = u64::from_le_bytes(std::fs::read(&gen).unwrap()[8..16].try_into().unwrap());
    assert_eq!(settled >> 32, 4);
}
