//! Records nothing has cached: a gather whose records were evicted from the page cache takes the
//! `pread` path and returns the same bytes, with the same checks, as one from memory; prefetch
//! is a hint that changes nothing but what is cached.

mod common;
use common::*;
use std::path::Path;
use zrecord::{Codec, Error, Store};

/// Drops every file of the store from the page cache.
fn evict(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let file = std::fs::File::open(entry.unwrap().path()).unwrap();
        file.sync_all().unwrap();
        rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    }
}

fn filled(dir: &Path, codec: Codec) -> (Store, Vec<Vec<u8>>) {
    let store = open_small_chunks(dir, codec, 1 << 20);
    let recs: Vec<Vec<u8>> =
        (0..300).map(|i| record(i, 1000 + (i as usize * 613) % 9000)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    store.sync().unwrap();
    (store, recs)
}

#[test]
fn evicted_records_read_back_exactly_in_every_codec() {
    for codec in [Codec::Raw, Codec::Zstd, Codec::ZstdDict] {
        let dir = tempfile::tempdir().unwrap();
        let store = open_small_chunks(dir.path(), codec, 1 << 20);
        if codec == Codec::ZstdDict {
            let samples: Vec<u8> = (0..200).flat_map(|i| record(i, 1000)).collect();
            store.train_dict(&samples, &[1000; 200], 4096).unwrap();
        }
        store.enable_checksums().unwrap();
        store.set_verify_reads(true);
        let recs: Vec<Vec<u8>> =
            (0..300).map(|i| record(i, 1000 + (i as usize * 613) % 9000)).collect();
        let (buf, off) = pack(&recs);
        store.append(&buf, &off, None).unwrap();
        store.sync().unwrap();
        let mut rng = Rng(codec as u64);
        for _ in 0..5 {
            let idx: Vec<u64> = (0..64).map(|_| rng.below(300)).collect();
            evict(dir.path());
            let got = read(&store, &idx);
            for (i, r) in idx.iter().zip(got) {
                assert!(r == recs[*i as usize], "record {i} read back wrong ({codec:?})");
            }
        }
        assert!(store.recently_cold(), "the gathers above went to the disk");
        assert_eq!(read_all(&store), recs);
        assert_eq!(read_all(&store), recs);
        assert!(!store.recently_cold(), "a read of everything cached is warm");
    }
}

/// 200 raw records of a page each, written, then opened afresh (nothing of them mapped:
/// pages a gather has copied out of the map stay mapped, and eviction cannot drop mapped
/// pages) and evicted.
fn paged_and_evicted(dir: &Path) -> (Store, Vec<Vec<u8>>) {
    let store = open_small_chunks(dir, Codec::Raw, 1 << 20);
    let recs: Vec<Vec<u8>> = (0..200).map(|i| record(i, 4096)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    store.sync().unwrap();
    drop(store);
    let store = open_small_chunks(dir, Codec::Raw, 1 << 20);
    evict(dir);
    (store, recs)
}

#[test]
fn a_cold_fixed_stride_gather_matches_a_warm_one() {
    let dir = tempfile::tempdir().unwrap();
    let (store, recs) = paged_and_evicted(dir.path());
    let idx: Vec<u64> = (0..200).rev().step_by(3).collect();
    let mut cold = vec![0u8; idx.len() * 4096];
    store.gather_fixed(&idx, &mut cold, 4096, usize::MAX).unwrap();
    assert!(store.recently_cold());
    let mut warm = vec![0u8; idx.len() * 4096];
    store.gather_fixed(&idx, &mut warm, 4096, usize::MAX).unwrap();
    assert!(!store.recently_cold());
    assert!(cold == warm);
    assert!(cold == idx.iter().flat_map(|&i| recs[i as usize].clone()).collect::<Vec<u8>>());
}

#[test]
fn a_batch_partly_read_ahead_is_read_as_a_cold_one() {
    // Readahead leaves batches partly in memory. While the store's reads go to the disk, the
    // probe looks at many records, not three: a batch whose first, middle and last records are
    // cached but whose others are not still takes the pread path (its other records would be
    // read a page per fault on the copy path).
    let dir = tempfile::tempdir().unwrap();
    let (store, recs) = paged_and_evicted(dir.path());
    // The records three probes of 200 look at (either rounding of the middle).
    let mut probed = vec![0u8; 4 * 4096];
    store.gather_fixed(&[0, 99, 100, 199], &mut probed, 4096, usize::MAX).unwrap();
    assert!(store.recently_cold(), "read from the disk: now cached");
    let all: Vec<u64> = (0..200).collect();
    let mut got = vec![0u8; 200 * 4096];
    store.gather_fixed(&all, &mut got, 4096, usize::MAX).unwrap();
    assert!(store.recently_cold(), "the first, middle and last records are cached, the rest not");
    assert!(got == recs.concat());
}

#[test]
fn a_cold_read_of_a_damaged_record_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = filled(dir.path(), Codec::Raw);
    // Cut the chunk file short under the store (as another program might): a record past
    // the new end is corruption, on the cold path as on the warm one.
    drop(store);
    let last =
        (0..4096).take_while(|i| dir.path().join(format!("{i}.zr")).exists()).last().unwrap();
    let chunk = dir.path().join(format!("{last}.zr"));
    let len = std::fs::metadata(&chunk).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&chunk).unwrap().set_len(len / 2).unwrap();
    let store = open_small_chunks(dir.path(), Codec::Raw, 1 << 20);
    evict(dir.path());
    let mut dst = vec![0u8; 20_000];
    let e = store.gather(&[299], &mut dst, &[0]).unwrap_err();
    assert!(matches!(e, Error::Corrupt { ref detail, .. } if detail.contains("record 299")), "{e}");
}

#[test]
fn prefetch_is_a_hint_that_reads_ahead_only_what_is_not_cached() {
    let dir = tempfile::tempdir().unwrap();
    let (store, recs) = filled(dir.path(), Codec::Zstd);
    let idx: Vec<u64> = (0..300).step_by(7).collect();
    assert!(!store.prefetch(&idx).unwrap(), "just written: cached, nothing to ask for");
    evict(dir.path());
    assert!(store.prefetch(&idx).unwrap());
    assert!(store.prefetch(&[10_000, 20_000]).is_ok(), "past the end: ignored");
    assert_eq!(
        read(&store, &idx),
        idx.iter().map(|&i| recs[i as usize].clone()).collect::<Vec<_>>()
    );
}

#[test]
fn compaction_leaves_uncached_what_no_reader_had_cached() {
    for hot in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = open_small_chunks(dir.path(), Codec::Raw, 1 << 20);
        let model = fill_with_holes(&store, 600);
        store.close().unwrap();
        drop(store);
        evict(dir.path());
        let store = open_small_chunks(dir.path(), Codec::Raw, 1 << 20);
        if hot {
            assert_eq!(read_all(&store), model); // a reader has every record in memory
        }
        assert!(store.compact().unwrap().moved > 0);
        let reader = open_small_chunks(dir.path(), Codec::Raw, 1 << 20);
        assert_eq!(read_all(&reader), model);
        assert_eq!(reader.recently_cold(), !hot, "hot: {hot}");
    }
}
