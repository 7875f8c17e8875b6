//! `gather_block_rows` against the rows it was given: every codec, rows that cross block
//! boundaries, a short last block, every shard count, and the refusals (a row past the
//! caller's count even when the store holds it, a block too short for its rows).

mod common;
use common::*;
use zrecord::{BlockLayout, Codec, Error, Store};

const ROW: usize = 13;
const BLOCK: u64 = 7;

/// A store of `rows` rows of `ROW` bytes in blocks of `BLOCK` rows, and the rows themselves.
fn block_store(dir: &std::path::Path, codec: Codec, rows: u64) -> (Store, Vec<Vec<u8>>) {
    let store = open(dir, codec);
    let all: Vec<Vec<u8>> = (0..rows).map(|r| record(r, ROW)).collect();
    let blocks: Vec<Vec<u8>> = all.chunks(BLOCK as usize).map(<[Vec<u8>]>::concat).collect();
    let (buf, offsets) = pack(&blocks);
    store.append(&buf, &offsets, None).unwrap();
    (store, all)
}

fn read(store: &Store, rows: &[u64], count: u64, shards: usize) -> Result<Vec<u8>, Error> {
    let mut dst = vec![0u8; rows.len() * ROW];
    let layout = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: count };
    store.gather_block_rows(rows, layout, &mut dst, shards).map(|()| dst)
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
    let err = store.gather_block_rows(&[1, 60], layout, &mut dst, 1).unwrap_err();
    assert!(matches!(err, Error::IndexOutOfRange { index: 60, len: 50 }), "{err}");
    assert!(dst.iter().all(|&b| b == 0xAA));
}

#[test]
fn a_count_the_store_cannot_hold_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = block_store(dir.path(), Codec::Raw, 100);
    // 100 rows fill 15 blocks, the last with 2 rows: row 101 of a claimed 105 lies past it.
    let err = read(&store, &[101], 105, 1).unwrap_err();
    assert!(err.to_string().contains("too few for row 101"), "{err}");
    let err = read(&store, &[0], 200, 1).unwrap_err();
    assert!(err.to_string().contains("store has 15 records"), "{err}");
}

#[test]
fn bad_layouts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = block_store(dir.path(), Codec::Raw, 10);
    let mut dst = vec![0u8; ROW];
    let zero = BlockLayout { block_rows: 0, row_len: ROW, rows: 10 };
    assert!(store.gather_block_rows(&[0], zero, &mut dst, 1).is_err());
    let short = BlockLayout { block_rows: BLOCK, row_len: ROW, rows: 10 };
    assert!(store.gather_block_rows(&[0, 1], short, &mut dst, 1).is_err());
}
