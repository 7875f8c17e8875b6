//! Compaction interrupted after every k-th record move, then re-run: the store always opens with
//! the same records, and the second run finishes the job.

mod common;
use common::*;
use zrecord::failpoint::Action;
use zrecord::Codec;

fn fragmented(dir: &std::path::Path) -> Vec<Vec<u8>> {
    fill_with_holes(&open_small_chunks(dir, Codec::Zstd, 8192), 120)
}

#[test]
fn interrupted_compaction_is_safe_at_every_kth_move() {
    for k in [1u64, 2, 3, 5, 8, 13, 21, 34, 55] {
        let dir = tempfile::tempdir().unwrap();
        let model = fragmented(dir.path());
        {
            let store = open_small_chunks(dir.path(), Codec::Zstd, 8192);
            store.failpoints().arm("compact:move", Action::FailAt(k));
            let e = store.compact().unwrap_err();
            assert!(e.to_string().contains("injected"), "k={k}: {e}");
            assert!(read_all(&store) == model, "k={k}: in the same handle");
        }
        let store = open_small_chunks(dir.path(), Codec::Zstd, 8192);
        assert!(read_all(&store) == model, "k={k}: after reopening");
        let before = store.stats().unwrap();
        store.compact().unwrap();
        let after = store.stats().unwrap();
        assert!(after.chunk_bytes < before.chunk_bytes, "k={k}");
        assert!(read_all(&store) == model, "k={k}: after finishing");
        // A third run has nothing left to move.
        assert_eq!(store.compact().unwrap().moved, 0);
    }
}

#[test]
fn compaction_interrupted_before_header_keeps_data() {
    for point in ["compact:staged", "compact:before-header"] {
        interrupted_at(point);
    }
}

fn interrupted_at(point: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model = fragmented(dir.path());
    {
        let store = open_small_chunks(dir.path(), Codec::Zstd, 8192);
        store.failpoints().arm(point, Action::FailAt(1));
        assert!(store.compact().is_err());
    }
    let store = open_small_chunks(dir.path(), Codec::Zstd, 8192);
    assert!(read_all(&store) == model);
    store.compact().unwrap();
    assert!(read_all(&store) == model);
}
