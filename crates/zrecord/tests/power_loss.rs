//! Power loss, simulated: the storage layer's journal (`zrecord::disk`) records every change an
//! append, sync, dictionary training or compaction makes; `crash_model` rebuilds what the disk
//! may hold after a cut between any two changes -- nothing unsynced kept, everything kept, and
//! seeded random mixes with torn sectors -- and each such store must open with a prefix of the
//! appended records (append) or with exactly the records it had (compaction). Injected `ENOSPC`
//! at every change checks that a full disk is a clear error that loses nothing.

mod common;
#[path = "power_loss/crash_model.rs"]
mod crash_model;

use std::path::Path;

use common::*;
use crash_model::{Fate, World};
use zrecord::disk::Change;
use zrecord::{Codec, Error, Options, Store};

const CAPACITY: u64 = 2048;
const RANDOM_FATES: u64 = 5;

/// Scratch space on tmpfs when there is one: each cut writes and syncs a whole store.
fn scratch() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

fn open_at(dir: &Path, codec: Codec) -> Store {
    Store::open(dir, Options { codec, chunk_capacity: CAPACITY }).unwrap()
}

/// Every fate to try at one cut.
fn fates(cut: usize, seed: u64) -> Vec<Fate> {
    let mut v = vec![Fate::AllLost, Fate::AllKept];
    v.extend((0..RANDOM_FATES).map(|r| Fate::Random(seed ^ ((cut as u64) << 16) ^ r)));
    v
}

/// What the test knows about the journal: where syncs returned and appends began.
#[derive(Default)]
struct Marks {
    /// (journal position after the sync returned, records it made durable)
    syncs: Vec<(usize, u64)>,
    /// (journal position before the append began, length after it)
    appends: Vec<(usize, u64)>,
}

impl Marks {
    /// Fewest and most records a store cut after `cut` changes may hold.
    fn bounds(&self, cut: usize, initial: u64) -> (u64, u64) {
        let lo = self.syncs.iter().filter(|(p, _)| *p <= cut).map(|s| s.1).max();
        let hi = self.appends.iter().filter(|(p, _)| *p < cut).map(|a| a.1).max();
        (lo.unwrap_or(initial), hi.unwrap_or(initial).max(initial))
    }
}

/// Replays `journal` over `world`, and at every cut checks each fate with `check`.
fn every_cut(
    world: &mut World,
    journal: &[Change],
    seed: u64,
    mut check: impl FnMut(usize, Fate, &Path),
) -> usize {
    let mut states = 0;
    for cut in 0..=journal.len() {
        if cut > 0 {
            world.apply(&journal[cut - 1]);
        }
        for fate in fates(cut, seed) {
            let out = scratch();
            world.crash_into(fate, out.path());
            check(cut, fate, out.path());
            states += 1;
        }
    }
    states
}

/// A seeded workload of appends (codecs mixed, sizes 0..900 so chunks roll over, syncs now and
/// then), recorded in the journal of a store that already holds `initial` synced records.
struct Workload {
    world: World,
    journal: Vec<Change>,
    marks: Marks,
    expected: Vec<Vec<u8>>,
    initial: u64,
}

fn append_workload(seed: u64, with_dict: bool, with_sums: bool) -> Workload {
    let dir = scratch();
    let mut rng = Rng(seed);
    let mut expected: Vec<Vec<u8>> = Vec::new();
    let store = open_at(dir.path(), Codec::Zstd);
    let first: Vec<Vec<u8>> = (0..3).map(|i| record(seed * 1000 + i, 300)).collect();
    let (buf, off) = pack(&first);
    store.append(&buf, &off, None).unwrap();
    store.sync().unwrap();
    expected.extend(first);
    let initial = expected.len() as u64;

    let world = World::snapshot(dir.path());
    let mut marks = Marks::default();
    store.disk().hooks().start_journal();
    let hooks = store.disk().hooks();
    if with_sums {
        store.enable_checksums().unwrap();
    }
    if with_dict {
        let samples: Vec<Vec<u8>> = (0..100).map(|i| record(50_000 + i, 1000)).collect();
        let (buf, _) = pack(&samples);
        store.train_dict(&buf, &[1000; 100], 2048).unwrap();
    }
    for step in 0..10u64 {
        let n = 1 + rng.below(5) as usize;
        let recs: Vec<Vec<u8>> = (0..n)
            .map(|i| record(seed * 1000 + 100 + step * 10 + i as u64, rng.below(900) as usize))
            .collect();
        let codec = match rng.below(if with_dict { 3 } else { 2 }) {
            0 => Codec::Raw,
            1 => Codec::Zstd,
            _ => Codec::ZstdDict,
        };
        let (buf, off) = pack(&recs);
        marks.appends.push((hooks.journal_len(), (expected.len() + n) as u64));
        store.append(&buf, &off, Some(codec)).unwrap();
        expected.extend(recs);
        if rng.below(3) == 0 {
            store.sync().unwrap();
            marks.syncs.push((hooks.journal_len(), expected.len() as u64));
        }
    }
    store.close().unwrap();
    marks.syncs.push((hooks.journal_len(), expected.len() as u64));
    let journal = hooks.take_journal();
    Workload { world, journal, marks, expected, initial }
}

fn check_prefix(dir: &Path, expected: &[Vec<u8>], (lo, hi): (u64, u64), what: &str) {
    let store = Store::open(dir, Options { codec: Codec::Zstd, chunk_capacity: CAPACITY })
        .unwrap_or_else(|e| panic!("{what}: the store does not open: {e}"));
    let len = store.len();
    assert!(lo <= len && len <= hi, "{what}: {len} records, expected {lo}..={hi}");
    let got = read_all(&store);
    for (i, rec) in got.iter().enumerate() {
        assert!(rec == &expected[i], "{what}: record {i} differs");
    }
    // Checksums, where kept, never report a record that is intact as damaged.
    let report = store.verify(usize::MAX).unwrap();
    assert!(report.failures.is_empty(), "{what}: {:?}", report.failures);
    // Appending goes on, and survives a reopen.
    let extra = record(99_999, 333);
    store.append(&extra, &[0], Some(Codec::Zstd)).unwrap();
    store.close().unwrap();
    drop(store);
    let store = open_at(dir, Codec::Zstd);
    assert_eq!(store.len(), len + 1, "{what}: after appending once more");
    assert!(read(&store, &[len])[0] == extra, "{what}: the new record");
}

#[test]
fn every_cut_of_appends_leaves_a_prefix() {
    let mut total = 0;
    for (seed, with_dict, with_sums) in [(1u64, false, false), (2, true, false), (3, false, true)] {
        let Workload { mut world, journal, marks, expected, initial } =
            append_workload(seed, with_dict, with_sums);
        assert!(journal.iter().any(|c| matches!(c, Change::Create { .. })), "no chunk rolled over");
        total += every_cut(&mut world, &journal, seed, |cut, fate, out| {
            let what = format!("seed {seed}, cut {cut}/{}, {fate:?}", journal.len());
            check_prefix(out, &expected, marks.bounds(cut, initial), &what);
        });
    }
    eprintln!("power-loss states checked (appends): {total}");
}

/// A store with deleted records (so compaction has work), synced; returns its live records.
fn fragmented(dir: &Path) -> Vec<Vec<u8>> {
    let store = open_at(dir, Codec::Zstd);
    store.enable_checksums().unwrap();
    let model = fill_with_holes(&store, 60);
    store.close().unwrap();
    model
}

#[test]
fn every_cut_of_a_compaction_keeps_every_record() {
    let dir = scratch();
    let model = fragmented(dir.path());
    let mut world = World::snapshot(dir.path());
    let store = open_at(dir.path(), Codec::Zstd);
    store.disk().hooks().start_journal();
    let report = store.compact().unwrap();
    assert!(report.moved > 10, "{report:?}");
    let journal = store.disk().hooks().take_journal();
    let done = store.stats().unwrap();
    drop(store);

    let states = every_cut(&mut world, &journal, 7, |cut, fate, out| {
        let what = format!("cut {cut}/{}, {fate:?}", journal.len());
        let store = Store::open(out, Options { codec: Codec::Zstd, chunk_capacity: CAPACITY })
            .unwrap_or_else(|e| panic!("{what}: the store does not open: {e}"));
        assert!(read_all(&store) == model, "{what}: records differ before re-running compact");
        let report = store.verify(usize::MAX).unwrap();
        assert!(report.failures.is_empty(), "{what}: {:?}", report.failures);
        store.compact().unwrap_or_else(|e| panic!("{what}: compact again: {e}"));
        assert!(read_all(&store) == model, "{what}: records differ after compact");
        assert_packed(&store, &done, &what);
    });
    eprintln!("power-loss states checked (compaction): {states}");
}

/// A finished compaction: the same space as an uninterrupted run, give or take the chunk-end
/// gaps (an interrupted run leaves some records in staging, so the re-run packs them in another
/// order), and nothing left to move.
fn assert_packed(store: &Store, done: &zrecord::Stats, what: &str) {
    let st = store.stats().unwrap();
    assert_eq!((st.records, st.live_bytes), (done.records, done.live_bytes), "{what}");
    let largest = 800; // no record of `fragmented` stores more
    assert!(st.reclaimable < st.chunks * largest, "{what}: {st:?} left unpacked");
    assert_eq!(store.compact().unwrap().moved, 0, "{what}: a third run still moves records");
}

fn is_enospc(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC))
}

/// The disk fills up at the n-th change of a workload, for every n: the failing call reports
/// ENOSPC, nothing committed is lost, and once space is back the same handle goes on.
#[test]
fn disk_full_at_every_change_is_a_clear_error() {
    let mut n = 1u64;
    loop {
        let dir = scratch();
        let store = open_at(dir.path(), Codec::Zstd);
        let mut model: Vec<Vec<u8>> = (0..4).map(|i| record(i, 500)).collect();
        let (buf, off) = pack(&model);
        store.append(&buf, &off, None).unwrap();
        store.sync().unwrap();
        let committed = model.len();
        store.disk().hooks().fail_nth_change(n, libc::ENOSPC);
        let mut failed = None;
        for step in 0..6u64 {
            let recs: Vec<Vec<u8>> = (0..3).map(|i| record(100 + step * 3 + i, 700)).collect();
            let (buf, off) = pack(&recs);
            let codec = if step % 2 == 0 { Codec::Raw } else { Codec::Zstd };
            match store.append(&buf, &off, Some(codec)) {
                Ok(_) => model.extend(recs),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            if step % 2 == 1 {
                if let Err(e) = store.sync() {
                    failed = Some(e);
                    break;
                }
            }
        }
        let Some(e) = failed else {
            store.disk().hooks().clear_failure();
            break; // n is past the workload's last change
        };
        assert!(is_enospc(&e), "change {n}: {e}");
        assert!(e.to_string().contains(dir.path().to_str().unwrap()), "change {n}: {e}");
        assert!(read_all(&store) == model, "change {n}: the handle lost records");
        {
            let other =
                Store::open(dir.path(), Options { codec: Codec::Zstd, chunk_capacity: CAPACITY })
                    .unwrap();
            let got = read_all(&other);
            assert!(got.len() >= committed && got[..] == model[..got.len()], "change {n}");
        }
        // Space is back: the same handle appends and syncs, and all of it survives a reopen.
        let more = record(7_777, 400);
        store.append(&more, &[0], None).unwrap();
        store.close().unwrap();
        model.push(more);
        drop(store);
        assert!(read_all(&open_at(dir.path(), Codec::Zstd)) == model, "change {n}: after reopen");
        n += 1;
    }
    assert!(n > 20, "the workload made only {n} changes");
    eprintln!("disk-full points checked (appends): {}", n - 1);
}

#[test]
fn disk_full_during_compaction_keeps_every_record() {
    let done = {
        let dir = scratch();
        fragmented(dir.path());
        let store = open_at(dir.path(), Codec::Zstd);
        store.compact().unwrap();
        store.stats().unwrap()
    };
    let mut n = 1u64;
    loop {
        let dir = scratch();
        let model = fragmented(dir.path());
        let store = open_at(dir.path(), Codec::Zstd);
        store.disk().hooks().fail_nth_change(n, libc::ENOSPC);
        match store.compact() {
            Ok(_) => {
                store.disk().hooks().clear_failure();
                assert!(read_all(&store) == model);
                break;
            }
            Err(e) => assert!(is_enospc(&e), "change {n}: {e}"),
        }
        assert!(read_all(&store) == model, "change {n}: in the same handle");
        drop(store);
        let store = open_at(dir.path(), Codec::Zstd);
        assert!(read_all(&store) == model, "change {n}: after reopening");
        store.compact().unwrap();
        assert!(read_all(&store) == model, "change {n}: after finishing");
        assert_packed(&store, &done, &format!("change {n}"));
        n += 1;
    }
    assert!(n > 20, "compaction made only {n} changes");
    eprintln!("disk-full points checked (compaction): {}", n - 1);
}
