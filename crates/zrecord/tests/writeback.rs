//! Long appends ask the kernel to start writing their bytes back as they go (`chunks.rs`,
//! `WRITEBACK_BYTES`): every full 4 MiB of a chunk once, in order, with no range twice and
//! nothing past what was written; a store's sync still makes them durable (`power_loss.rs`),
//! and the bytes read back are the bytes appended, raw and compressed, on one thread or many.

mod common;

use common::{open, pack, read_all, Rng};
use zrecord::Codec;

const MIB: u64 = 1 << 20;

fn noise(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

#[test]
fn every_full_four_mib_of_a_chunk_is_written_back_once_in_order() {
    for codec in [Codec::Raw, Codec::Zstd] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), codec);
        let mut rng = Rng(7);
        store.disk().hooks().start_journal();
        let mut expected = Vec::new();
        // 11 appends of 1 MiB in records of 64 KiB (incompressible: zstd stores them raw,
        // so the chunk grows by the same bytes), then one small one.
        for _ in 0..11 {
            let recs: Vec<Vec<u8>> = (0..16).map(|_| noise(&mut rng, 64 << 10)).collect();
            let (buf, off) = pack(&recs);
            store.append(&buf, &off, None).unwrap();
            expected.extend(recs);
        }
        let (buf, off) = pack(&[b"tail".to_vec()]);
        store.append(&buf, &off, None).unwrap();
        expected.push(b"tail".to_vec());
        let ranges = store.disk().hooks().take_writebacks();
        let chunk: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|(file, _, _)| file.file_name().is_some_and(|n| n == "0.zr"))
            .map(|(_, offset, len)| (*offset, *len))
            .collect();
        assert_eq!(chunk.len(), ranges.len(), "only the chunk file: {ranges:?}");
        assert!(chunk.len() >= 2, "{codec:?}: 11 MiB written, {chunk:?}");
        let mut at = 0;
        for &(offset, len) in &chunk {
            assert_eq!(offset, at, "{codec:?}: ranges follow one another: {chunk:?}");
            assert!(len >= 4 * MIB, "{codec:?}: at least 4 MiB a range: {chunk:?}");
            at = offset + len;
        }
        let written = std::fs::metadata(dir.path().join("0.zr")).unwrap().len();
        assert!(at <= written && written - at < 4 * MIB + MIB, "{codec:?}: {at} of {written}");
        store.sync().unwrap();
        assert_eq!(read_all(&store), expected);
    }
}

#[test]
fn small_appends_start_no_write_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Raw);
    store.disk().hooks().start_journal();
    let (buf, off) = pack(&(0..100u8).map(|i| vec![i; 1000]).collect::<Vec<_>>());
    store.append(&buf, &off, None).unwrap();
    assert!(store.disk().hooks().take_writebacks().is_empty());
}
