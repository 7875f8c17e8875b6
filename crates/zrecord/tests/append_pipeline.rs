//! The pipelined compressed append (`pipeline.rs`) against the serial one: the same appends
//! on 1, 2, 3 and 8 threads give byte-identical stores (chunk files, table entries, checksums),
//! records that do not shrink are stored raw, and a failure in the middle of a pipeline leaves
//! the committed records and lets the handle go on. One test function per concern; the thread
//! count is global, so each test sets it and the file's tests run one at a time under a lock.

mod common;

use std::path::Path;
use std::sync::Mutex;

use common::{pack, read_all, record, Rng};
use zrecord::pool::set_num_threads;
use zrecord::{Codec, Error, Options, Store};

/// Small chunks, so that a pipeline rolls over several of them.
const CAPACITY: u64 = 3 << 20;

static THREADS: Mutex<()> = Mutex::new(());

/// A store's files by name, with their bytes.
type Files = Vec<(String, Vec<u8>)>;

fn open_at(dir: &Path) -> Store {
    Store::open(dir, Options { codec: Codec::Zstd, chunk_capacity: CAPACITY }).unwrap()
}

/// Appends of many records each: compressible ones, random ones (which zstd cannot shrink),
/// empty and one-byte ones, and a few of the 1 MiB maximum.
fn batches(seed: u64) -> Vec<Vec<Vec<u8>>> {
    let mut rng = Rng(seed);
    (0..4)
        .map(|b| {
            (0..300u64)
                .map(|i| {
                    let tag = seed * 10_000 + b * 1000 + i;
                    match rng.below(10) {
                        0 => (0..rng.below(20_000)).map(|_| rng.next() as u8).collect(),
                        1 => Vec::new(),
                        2 => vec![rng.next() as u8],
                        3 if i % 97 == 0 => record(tag, 1 << 20),
                        _ => record(tag, rng.below(24_000) as usize),
                    }
                })
                .collect()
        })
        .collect()
}

/// The bytes that make up a store: every chunk file whole, and the used prefix of the table
/// and of the checksum file (both are sparse files of fixed, large size).
fn store_bytes(dir: &Path, records: u64) -> Files {
    let mut out = Vec::new();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for name in names {
        let bytes = std::fs::read(dir.join(&name)).ok();
        let used = (16 + records * 16) as usize;
        let bytes = match (name.as_str(), bytes) {
            ("meta.zr" | "sums.zr", _) => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::File::open(dir.join(&name)).unwrap();
                let mut b = vec![0u8; used];
                f.read_exact_at(&mut b, 0).unwrap();
                b
            }
            (_, Some(b)) => b,
            (_, None) => continue,
        };
        out.push((name, bytes));
    }
    out
}

/// Writes the workload on `threads` threads and returns the store's bytes and records.
fn write(threads: usize, codec: Codec, sums: bool) -> (Files, Vec<Vec<u8>>) {
    set_num_threads(threads);
    let dir = tempfile::tempdir().unwrap();
    let store = open_at(dir.path());
    if sums {
        store.enable_checksums().unwrap();
    }
    if codec == Codec::ZstdDict {
        let samples: Vec<Vec<u8>> = (0..400).map(|i| record(i, 2000)).collect();
        let (buf, _) = pack(&samples);
        store.train_dict(&buf, &vec![2000; 400], 8192).unwrap();
    }
    let mut model = Vec::new();
    for batch in batches(7) {
        let (buf, off) = pack(&batch);
        store.append(&buf, &off, Some(codec)).unwrap();
        model.extend(batch);
    }
    store.close().unwrap();
    assert!(read_all(&store) == model, "{threads} threads: records differ");
    let bytes = store_bytes(dir.path(), model.len() as u64);
    (bytes, model)
}

#[test]
fn every_thread_count_writes_the_same_bytes() {
    let _one = THREADS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for (codec, sums) in [(Codec::Zstd, false), (Codec::Zstd, true), (Codec::ZstdDict, true)] {
        let (serial, model) = write(1, codec, sums);
        // The workload spans several chunk files.
        let chunks = serial.iter().filter(|(n, _)| n.starts_with(|c: char| c.is_ascii_digit()));
        assert!(chunks.count() >= 2);
        for threads in [2, 3, 8] {
            let (parallel, _) = write(threads, codec, sums);
            assert_eq!(serial.len(), parallel.len(), "{codec:?}: files differ");
            for ((name, a), (other, b)) in serial.iter().zip(&parallel) {
                assert_eq!(name, other);
                assert!(a == b, "{codec:?} sums={sums}, {threads} threads: {name} differs");
            }
        }
        // Each workload stores some records raw (random ones) and some compressed.
        let dir = tempfile::tempdir().unwrap();
        set_num_threads(4);
        let store = open_at(dir.path());
        let (buf, off) = pack(&model);
        store.append(&buf, &off, Some(Codec::Zstd)).unwrap();
        let stats = store.stats().unwrap();
        assert!(stats.compressed_records > 0 && stats.compressed_records < stats.records);
    }
    set_num_threads(0);
}

/// Random bytes do not shrink: stored raw, at their own length, through the pipeline too.
#[test]
fn records_that_do_not_shrink_are_stored_raw() {
    let _one = THREADS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    set_num_threads(4);
    let dir = tempfile::tempdir().unwrap();
    let store = open_at(dir.path());
    let mut rng = Rng(3);
    let recs: Vec<Vec<u8>> =
        (0..200).map(|_| (0..12_288).map(|_| rng.next() as u8).collect()).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, Some(Codec::Zstd)).unwrap();
    let stats = store.stats().unwrap();
    assert_eq!(stats.compressed_records, 0);
    assert_eq!(stats.live_bytes, 200 * 12_288);
    assert!(read_all(&store) == recs);
    set_num_threads(0);
}

/// The disk fills up at the n-th change of a pipelined append, for every n it makes: the append
/// reports ENOSPC, the committed records are intact (in this handle and in a new one), and
/// once there is space again the same handle appends and all of it survives a reopen.
#[test]
fn a_failure_mid_pipeline_keeps_the_committed_state() {
    let _one = THREADS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    set_num_threads(4);
    let mut n = 1u64;
    loop {
        let dir = tempfile::tempdir().unwrap();
        let store = open_at(dir.path());
        let mut model: Vec<Vec<u8>> = (0..50).map(|i| record(i, 5000)).collect();
        let (buf, off) = pack(&model);
        store.append(&buf, &off, None).unwrap();
        store.sync().unwrap();
        let big: Vec<Vec<u8>> = (0..1500).map(|i| record(1000 + i, 9000)).collect();
        let (buf, off) = pack(&big);
        store.disk().hooks().fail_nth_change(n, libc::ENOSPC);
        match store.append(&buf, &off, Some(Codec::Zstd)) {
            Ok(_) => {
                store.disk().hooks().clear_failure();
                break; // n is past the append's last change
            }
            Err(e) => {
                assert!(
                    matches!(&e, Error::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC)),
                    "change {n}: {e}"
                );
            }
        }
        store.disk().hooks().clear_failure();
        assert_eq!(store.len(), 50, "change {n}");
        assert!(read_all(&store) == model, "change {n}: the handle lost records");
        assert!(read_all(&open_at(dir.path())) == model, "change {n}: another handle");
        store.append(&buf, &off, Some(Codec::Zstd)).unwrap();
        store.close().unwrap();
        model.extend(big);
        drop(store);
        assert!(read_all(&open_at(dir.path())) == model, "change {n}: after reopen");
        n += 1;
    }
    assert!(n > 5, "the pipelined append made only {n} changes");
    set_num_threads(0);
}
