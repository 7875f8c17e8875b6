//! Stores from elsewhere: symlinks, FIFOs and oversized files in place of store files are
//! refused (never followed, never waited on, never allocated), temporary files are never written
//! through a link, and a header length past the records ever written is refused at open.

mod common;
use common::*;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use zrecord::format::MAX_DICT_BYTES;
use zrecord::{Codec, Error, Options, Store};

fn store_with_records(dir: &Path, n: u64) -> Vec<Vec<u8>> {
    let store = open(dir, Codec::Zstd);
    let recs: Vec<Vec<u8>> = (0..n).map(|i| record(i, 200 + i as usize)).collect();
    let (buf, off) = pack(&recs);
    store.append(&buf, &off, None).unwrap();
    store.close().unwrap();
    recs
}

fn assert_corrupt(e: &Error, says: &str) {
    assert!(matches!(e, Error::Corrupt { ref detail, .. } if detail.contains(says)), "{e}");
}

/// Runs `f` on a thread and fails the test if it has not returned within a minute (a FIFO that
/// is opened blocking would hang forever).
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()).unwrap());
    rx.recv_timeout(Duration::from_secs(60)).expect("the call hung")
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn a_chunk_that_is_a_symlink_is_neither_read_nor_written() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    store_with_records(&dir, 20);
    let outside = root.path().join("outside");
    std::fs::rename(dir.join("0.zr"), &outside).unwrap();
    let before = std::fs::read(&outside).unwrap();
    symlink(&outside, dir.join("0.zr")).unwrap();
    let store = open(&dir, Codec::Zstd);
    let mut dst = vec![0u8; 4096];
    assert_corrupt(&store.gather(&[0], &mut dst, &[0]).unwrap_err(), "symbolic link");
    assert_corrupt(&store.append(b"more", &[0], None).unwrap_err(), "symbolic link");
    store.delete(&[1]).unwrap();
    assert!(matches!(store.compact().unwrap_err(), Error::Corrupt { .. }));
    drop(store);
    assert_eq!(std::fs::read(&outside).unwrap(), before);
}

#[test]
fn temporary_files_are_never_written_through_a_link() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    let recs = store_with_records(&dir, 10);
    let outside = root.path().join("outside");
    std::fs::write(&outside, b"precious").unwrap();
    let pid = std::process::id();
    for name in [format!("sums.tmp.{pid}"), format!("dict.tmp.{pid}"), "sums.zr.tmp".into()] {
        symlink(&outside, dir.join(name)).unwrap();
    }
    let store = open(&dir, Codec::Zstd);
    assert_eq!(store.enable_checksums().unwrap(), 10);
    assert!(store.verify(usize::MAX).unwrap().failures.is_empty());
    assert_eq!(read_all(&store), recs);
    assert_eq!(std::fs::read(&outside).unwrap(), b"precious");
}

#[test]
fn fifos_in_place_of_store_files_are_refused_at_once() {
    let root = tempfile::tempdir().unwrap();
    for name in ["dict.zr", "sums.zr", "meta.zr"] {
        let dir = root.path().join(name);
        store_with_records(&dir, 3);
        let _ = std::fs::remove_file(dir.join(name));
        mkfifo(&dir.join(name));
        let e = within_a_minute(move || Store::open(&dir, Options::default()).err());
        assert_corrupt(&e.expect("opened"), "FIFO");
    }
    let dir = root.path().join("chunk");
    store_with_records(&dir, 3);
    std::fs::remove_file(dir.join("0.zr")).unwrap();
    mkfifo(&dir.join("0.zr"));
    let e = within_a_minute(move || {
        let store = open(&dir, Codec::Zstd);
        let mut dst = vec![0u8; 4096];
        store.gather(&[0], &mut dst, &[0]).unwrap_err()
    });
    assert_corrupt(&e, "FIFO");
}

#[test]
fn a_dictionary_file_is_never_followed_or_read_past_its_limit() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("zero");
    store_with_records(&dir, 3);
    symlink("/dev/zero", dir.join("dict.zr")).unwrap();
    let e = within_a_minute(move || Store::open(&dir, Options::default()).err());
    assert_corrupt(&e.expect("opened"), "symbolic link");

    let dir = root.path().join("huge");
    store_with_records(&dir, 3);
    let f = std::fs::File::create(dir.join("dict.zr")).unwrap();
    f.set_len(MAX_DICT_BYTES + 1).unwrap(); // sparse: nothing is written
    let e = Store::open(&dir, Options::default()).err().expect("opened");
    assert_corrupt(&e, "limit");

    let store = open(&root.path().join("train"), Codec::Zstd);
    let samples = vec![7u8; 4096];
    let e = store.train_dict(&samples, &[1024; 4], 1 << 40).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(ref m) if m.contains("target")), "{e}");
}

#[test]
fn a_header_length_past_the_written_records_is_refused_at_open() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s");
    store_with_records(&dir, 10);
    let meta = dir.join("meta.zr");
    let patch = |len: u32| {
        let f = std::fs::OpenOptions::new().write(true).open(&meta).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &len.to_le_bytes(), 12).unwrap();
    };
    // Past the table page the records were written on. (A length a few entries past the last
    // record, inside that page, names zeroed entries: empty records, which can be true.)
    for phantom in [300, 5_000, 5_000_000] {
        patch(phantom);
        let e = Store::open(&dir, Options::default()).err().expect("opened");
        assert_corrupt(&e, "never written");
    }
    patch(10);
    assert_eq!(open(&dir, Codec::Zstd).len(), 10);
}

#[test]
fn a_store_of_empty_records_passes_the_length_check() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Codec::Raw);
    store.append(&[], &vec![0; 600], None).unwrap();
    store.close().unwrap();
    drop(store);
    assert_eq!(open(dir.path(), Codec::Raw).len(), 600);
}

#[test]
fn a_meta_file_that_is_a_symlink_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let real = root.path().join("real");
    store_with_records(&real, 2);
    let dir = root.path().join("s");
    std::fs::create_dir(&dir).unwrap();
    symlink(real.join("meta.zr"), dir.join("meta.zr")).unwrap();
    let e = Store::open(&dir, Options::default()).err().expect("opened");
    assert_corrupt(&e, "symbolic link");
}
