//! Delete and compact against a plain list model, over random operation sequences, with a
//! small chunk capacity so that records roll over between chunks and compaction moves records
//! across chunk boundaries.

mod common;
use common::*;
use proptest::prelude::*;
use zrecord::Codec;

#[derive(Clone, Debug)]
enum Op {
    Append { sizes: Vec<usize>, codec: u8 },
    Delete { picks: Vec<u64> },
    Compact,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::collection::vec(0usize..900, 1..12), 0u8..2)
            .prop_map(|(sizes, codec)| Op::Append { sizes, codec }),
        3 => prop::collection::vec(any::<u64>(), 1..6).prop_map(|picks| Op::Delete { picks }),
        2 => Just(Op::Compact),
        1 => Just(Op::Reopen),
    ]
}

/// Applies swap-tail deletion to the model, exactly as the store defines it.
fn model_delete(model: &mut Vec<Vec<u8>>, targets: &[u64]) {
    let mut t = targets.to_vec();
    t.sort_unstable_by(|a, b| b.cmp(a));
    t.dedup();
    for i in t {
        model.swap_remove(i as usize);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn store_matches_list_model(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let capacity = 4096;
        let mut store = open_small_chunks(dir.path(), Codec::Zstd, capacity);
        let mut model: Vec<Vec<u8>> = Vec::new();
        let mut tag = 0u64;
        for op in ops {
            match op {
                Op::Append { sizes, codec } => {
                    let recs: Vec<Vec<u8>> = sizes.iter().map(|&n| { tag += 1; record(tag, n) }).collect();
                    let (buf, off) = pack(&recs);
                    let codec = if codec == 0 { Codec::Raw } else { Codec::Zstd };
                    let first = store.append(&buf, &off, Some(codec)).unwrap();
                    prop_assert_eq!(first, model.len() as u64);
                    model.extend(recs);
                }
                Op::Delete { picks } => {
                    if model.is_empty() { continue; }
                    let targets: Vec<u64> = picks.iter().map(|p| p % model.len() as u64).collect();
                    store.delete(&targets).unwrap();
                    model_delete(&mut model, &targets);
                }
                Op::Compact => {
                    let before = store.stats().unwrap();
                    let report = store.compact().unwrap();
                    let after = store.stats().unwrap();
                    prop_assert!(after.chunk_bytes <= before.chunk_bytes);
                    prop_assert_eq!(after.live_bytes, before.live_bytes);
                    prop_assert_eq!(report.chunk_bytes_after, after.chunk_bytes);
                    // Packed: only the slack at chunk ends (less than one record each) remains.
                    prop_assert!(after.reclaimable <= after.chunks * 900, "{:?}", after);
                    // Nothing remains past the frontier.
                    for id in after.chunks.max(1)..after.chunks + 3 {
                        let path = dir.path().join(format!("{id}.zr"));
                        prop_assert!(!path.exists(), "{} exists", path.display());
                    }
                }
                Op::Reopen => {
                    store.sync().unwrap();
                    drop(store);
                    store = open_small_chunks(dir.path(), Codec::Zstd, capacity);
                }
            }
            prop_assert_eq!(store.len(), model.len() as u64);
            prop_assert_eq!(read_all(&store), model.clone());
        }
    }
}

#[test]
fn delete_accepts_duplicates_and_refuses_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Raw);
    let recs: Vec<Vec<u8>> = (0..10).map(|i| record(i, 20)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    let e = store.delete(&[3, 10]).unwrap_err();
    assert!(matches!(e, zrecord::Error::IndexOutOfRange { index: 10, len: 10 }), "{e}");
    assert_eq!(store.len(), 10, "a refused delete deletes nothing");
    store.delete(&[3, 3, 9, 0]).unwrap();
    let mut model = recs.clone();
    model_delete(&mut model, &[3, 9, 0]);
    assert_eq!(read_all(&store), model);
    assert_eq!(store.len(), 7);
}
