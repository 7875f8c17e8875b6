//! `gather_block_rows` against the rows it was given: every codec, rows that cross block
//! boundaries, a short last block, every shard count, and the refusals (a row past the
//! caller's count even when the store holds it, a block too short for its rows).

mod common;
use common::*;
use zrecord::{BlockLayout, Codec, Error, Store};

const ROW: usize = 13;
const BLOCK: u64 = 7;

/// A store of the full blocks of `rows` rows of `ROW` bytes (`BLOCK` rows a block), and the
/// rows themselves; the rows after the last full block are the caller's tail ([`tail`]).
fn block_store(dir: &std::path::Path, codec: Codec, rows: u64) -> (Store, Vec<Vec<u8>>) {
    let store = open(dir, codec);
    let all: Vec<Vec<u8>> = (0..rows).map(|r| record(r, ROW)).collect();
    let blocks: Vec<Vec<u8>> = all.chunks_exact(BLOCK as usize).map(<[Vec<u8>]>::concat).collect();
    let (buf, offsets) = pack(&blocks);
    store.append(&buf, &offsets, None).unwrap();
    (store, all)
}

/// The tail of `count` rows: those after its last full block.
fn tail(count: u64) -> Vec<u8> {
    (count / BLOCK * BLOCK..count).flat_map(|r| record(r, ROW)).collect()
}

fn read(store: &Store, rows: &[u64], count: u64, shards: usize) -> Result<Vec<u8>, Error> {
    let mut dst = vec![0u8; rows.len() * ROW];
    let layout = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: count };
    store.gather_block_rows(rows, layout, &tail(count), &mut dst, shards).map(|()| dst)
}

#[test]
fn rows_read_back_for_every_codec_and_shard_count() {
    for codec in [Codec::Raw, Codec::Zstd] {
        let dir = tempfile::tempdir().unwrap();
        let (store, all) = block_store(dir.path(), codec, 100);
        let mut rng = Rng(3);
        let rows: Vec<u64> = (0..500).map(|_| rng.below(100)).chain([0, 6, 7, 98, 99]).collect();
        for shards in [1, 2, usize::MAX] {
            let got = read(&store, &rows, 100, shards).unwrap();
            for (i, &r) in rows.iter().enumerate() {
                assert_eq!(&got[i * ROW..][..ROW], &all[r as usize][..], "{codec:?} row {r}");
            }
        }
    }
}

#[test]
fn rows_past_the_callers_count_are_refused_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = block_store(dir.path(), Codec::Raw, 100);
    // The store holds 100 rows, but the commit point the reader was given says 50.
    let mut dst = vec![0xAAu8; 2 * ROW];
    let layout = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: 50 };
    let err = store.gather_block_rows(&[1, 60], layout, &[], &mut dst, 1).unwrap_err();
    assert!(matches!(err, Error::IndexOutOfRange { index: 60, len: 50 }), "{err}");
    assert!(dst.iter().all(|&b| b == 0xAA));
}

#[test]
fn a_count_the_store_cannot_hold_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = block_store(dir.path(), Codec::Raw, 100);
    // 100 rows: 14 full blocks stored. A count of 200 needs 28.
    let err = read(&store, &[0], 200, 1).unwrap_err();
    assert!(err.to_string().contains("store has 14 records"), "{err}");
    // A block shorter than its rows: a store of one 3-row record read as blocks of 7.
    let short = tempfile::tempdir().unwrap();
    let z = open(short.path(), Codec::Raw);
    let (buf, offsets) = pack(&[vec![1u8; 3 * ROW]]);
    z.append(&buf, &offsets, None).unwrap();
    let err = read(&z, &[5], 7, 1).unwrap_err();
    assert!(err.to_string().contains("too few for row 5"), "{err}");
}

#[test]
fn bad_layouts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = block_store(dir.path(), Codec::Raw, 10);
    let mut dst = vec![0u8; ROW];
    let zero = BlockLayout { block_rows: 0, row_len: ROW, rows: 10 };
    assert!(store.gather_block_rows(&[0], zero, &[], &mut dst, 1).is_err());
    let short = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: 10 };
    assert!(store.gather_block_rows(&[0, 1], short, &[], &mut dst, 1).is_err());
}

#[test]
fn the_tail_holds_the_rows_after_the_full_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // 98 rows: 14 full blocks in the store, rows 98..101 in the caller's tail.
    let (store, all) = block_store(dir.path(), Codec::Raw, 101);
    let extra: Vec<Vec<u8>> = (98..101).map(|r| record(r, ROW)).collect();
    let tail = extra.concat();
    let layout = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: 101 };
    let rows = [100, 0, 97, 98, 99, 50];
    let mut dst = vec![0u8; rows.len() * ROW];
    store.gather_block_rows(&rows, layout, &tail, &mut dst, 2).unwrap();
    for (i, &r) in rows.iter().enumerate() {
        let want = if r < 98 { &all[r as usize] } else { &extra[r as usize - 98] };
        assert_eq!(&dst[i * ROW..][..ROW], &want[..], "row {r}");
    }
    // A tail that does not start at a block boundary is refused.
    let bad = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: 100 };
    assert!(store.gather_block_rows(&[0], bad, &tail, &mut dst[..ROW], 1).is_err());
}

#[test]
fn truncate_drops_a_tail_and_appends_continue_without_disturbing_readers() {
    let dir = tempfile::tempdir().unwrap();
    let (store, all) = block_store(dir.path(), Codec::Raw, 70);
    store.sync().unwrap();
    let reader = open(dir.path(), Codec::Raw);
    assert_eq!(reader.len(), 10);
    store.truncate(8).unwrap();
    assert_eq!(store.len(), 8);
    assert!(store.truncate(9).is_err());
    let (buf, offsets) = pack(&[vec![7u8; BLOCK as usize * ROW]]);
    store.append(&buf, &offsets, None).unwrap();
    store.sync().unwrap();
    // The other handle reads the kept blocks as before, with no StoreChangedError.
    let got = read(&reader, &[0, 55], 56, 1).unwrap(); // 56 rows: 8 blocks, no tail
    assert_eq!(&got[..ROW], &all[0][..]);
    assert_eq!(&got[ROW..], &all[55][..]);
    let mut got = vec![0u8; ROW];
    let nine = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: 63 };
    reader.gather_block_rows(&[57], nine, &[], &mut got, 1).unwrap();
    assert_eq!(got, vec![7u8; ROW]);
}
