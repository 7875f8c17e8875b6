//! The storage layer: every change the engine makes to a store's files (positional writes, size
//! changes, creations, renames, removals, syncs of files and of the directory) goes through
//! [`Disk`]. In normal builds each method is the plain system call.
//!
//! With the `testing` feature a `Disk` can also keep a journal of those changes, in the order
//! they happened, so that a test can rebuild what a disk might hold after a power cut at any
//! point: the synced state plus any subset of the unsynced changes (`tests/power_loss.rs`). It
//! can fail the n-th change with an injected OS error such as `ENOSPC`. Reads are not journaled.
//!
//! The header words of `meta.zr` are stored through the mmap, not through a system call; the
//! store reports them with [`Disk::note_mapped_write`] so the journal sees them as the unsynced
//! writes they are.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::OPEN_FLAGS;

/// One change to the files of a store, as the journal records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new, empty file (its name is durable only after a [`Change::SyncDir`]).
    Create { file: PathBuf },
    /// Bytes written at an offset (through `pwrite` or the mmap).
    Write { file: PathBuf, offset: u64, data: Vec<u8> },
    /// The file's size set (`ftruncate`).
    SetLen { file: PathBuf, len: u64 },
    /// A byte range deallocated, reading as zeros from now on; the size is unchanged.
    PunchHole { file: PathBuf, offset: u64, len: u64 },
    /// `fsync`/`fdatasync` of the file: its contents and size are durable.
    SyncFile { file: PathBuf },
    /// A rename (durable only after a [`Change::SyncDir`]).
    Rename { from: PathBuf, to: PathBuf },
    /// Two names swapped atomically (durable only after a [`Change::SyncDir`]).
    Exchange { a: PathBuf, b: PathBuf },
    /// A removal (durable only after a [`Change::SyncDir`]).
    Remove { file: PathBuf },
    /// `fsync` of the directory: its names are durable.
    SyncDir { dir: PathBuf },
}

#[cfg(any(test, feature = "testing"))]
mod hooks {
    use super::Change;
    use std::io;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    #[derive(Default)]
    struct Journal {
        changes: Vec<Change>,
        /// Write-backs started (file, offset, length): hints, not changes.
        writebacks: Vec<(std::path::PathBuf, u64, u64)>,
        /// Fail the n-th change from now (1 = the next) with this errno.
        fail: Option<(u64, i32)>,
    }

    /// Test hooks: a journal of changes and injected failures.
    #[derive(Default)]
    pub struct Hooks {
        recording: AtomicBool,
        armed: AtomicBool,
        journal: Mutex<Journal>,
    }

    impl Hooks {
        fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
            self.journal.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        /// Clears the journal and starts recording.
        pub fn start_journal(&self) {
            self.journal().changes.clear();
            self.journal().writebacks.clear();
            self.recording.store(true, Ordering::SeqCst);
        }

        /// Stops recording and returns the journal.
        pub fn take_journal(&self) -> Vec<Change> {
            self.recording.store(false, Ordering::SeqCst);
            std::mem::take(&mut self.journal().changes)
        }

        /// The write-backs started while recording, in order (see [`super::Disk::start_writeback`]).
        pub fn take_writebacks(&self) -> Vec<(std::path::PathBuf, u64, u64)> {
            std::mem::take(&mut self.journal().writebacks)
        }

        pub(super) fn note_writeback(&self, file: &std::path::Path, offset: u64, len: u64) {
            if self.recording.load(Ordering::Acquire) {
                self.journal().writebacks.push((file.to_path_buf(), offset, len));
            }
        }

        /// Number of changes recorded so far.
        pub fn journal_len(&self) -> usize {
            self.journal().changes.len()
        }

        /// Makes the `nth` change from now (1 = the next) fail with OS error `errno`, once.
        pub fn fail_nth_change(&self, nth: u64, errno: i32) {
            self.journal().fail = Some((nth.max(1), errno));
            self.armed.store(true, Ordering::SeqCst);
        }

        /// Cancels an injected failure that has not fired yet.
        pub fn clear_failure(&self) {
            self.journal().fail = None;
            self.armed.store(false, Ordering::SeqCst);
        }

        pub(super) fn before(&self) -> io::Result<()> {
            if !self.armed.load(Ordering::Acquire) {
                return Ok(());
            }
            let mut j = self.journal();
            match &mut j.fail {
                Some((1, errno)) => {
                    let errno = *errno;
                    j.fail = None;
                    self.armed.store(false, Ordering::Release);
                    Err(io::Error::from_raw_os_error(errno))
                }
                Some((n, _)) => {
                    *n -= 1;
                    Ok(())
                }
                None => Ok(()),
            }
        }

        pub(super) fn after(&self, change: impl FnOnce() -> Change) {
            if self.recording.load(Ordering::Acquire) {
                let change = change();
                self.journal().changes.push(change);
            }
        }
    }
}

#[cfg(not(any(test, feature = "testing")))]
mod hooks {
    use super::Change;
    use std::io;

    /// No hooks in normal builds: every call is empty and inlined away.
    #[derive(Default)]
    pub struct Hooks;

    impl Hooks {
        #[inline(always)]
        pub(super) fn before(&self) -> io::Result<()> {
            Ok(())
        }

        #[inline(always)]
        pub(super) fn after(&self, _change: impl FnOnce() -> Change) {}

        #[inline(always)]
        pub(super) fn note_writeback(&self, _file: &std::path::Path, _offset: u64, _len: u64) {}
    }
}

pub use hooks::Hooks;

/// The engine's way to change files; see the module docs. One per store handle.
#[derive(Default)]
pub struct Disk {
    hooks: Hooks,
}

impl Disk {
    /// The test hooks of this handle (journal, injected failures).
    #[cfg(any(test, feature = "testing"))]
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// Runs one change: an injected failure first, then the call, then the journal entry.
    fn change<T>(
        &self,
        call: impl FnOnce() -> io::Result<T>,
        entry: impl FnOnce() -> Change,
    ) -> io::Result<T> {
        self.hooks.before()?;
        let out = call()?;
        self.hooks.after(entry);
        Ok(out)
    }

    /// `pwrite` of all of `data` at `offset`.
    pub fn write_at(&self, file: &File, path: &Path, offset: u64, data: &[u8]) -> io::Result<()> {
        self.change(
            || file.write_all_at(data, offset),
            || Change::Write { file: path.to_path_buf(), offset, data: data.to_vec() },
        )
    }

    /// Bytes already stored through a shared mapping of `path` (journal only: cannot fail).
    pub fn note_mapped_write(&self, path: &Path, offset: u64, data: &[u8]) {
        self.hooks.after(|| Change::Write {
            file: path.to_path_buf(),
            offset,
            data: data.to_vec(),
        });
    }

    /// `ftruncate`.
    pub fn set_len(&self, file: &File, path: &Path, len: u64) -> io::Result<()> {
        self.change(|| file.set_len(len), || Change::SetLen { file: path.to_path_buf(), len })
    }

    /// `fdatasync`: data and size (the only metadata a reader needs) reach the disk.
    pub fn sync_file(&self, file: &File, path: &Path) -> io::Result<()> {
        self.change(|| file.sync_data(), || Change::SyncFile { file: path.to_path_buf() })
    }

    /// Asks the kernel to start writing `len` bytes at `offset` of `file` to the disk, without
    /// waiting for them (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`). A hint, not a change:
    /// it makes nothing durable (only [`Disk::sync_file`] does) and nothing a reader sees
    /// differs, so the journal does not record it, and an error is ignored (the sync that
    /// follows reports the real ones). Elsewhere than Linux it does nothing.
    pub fn start_writeback(&self, file: &File, path: &Path, offset: u64, len: u64) {
        crate::writeback::start(file, offset, len);
        self.hooks.note_writeback(path, offset, len);
    }

    /// Deallocates `len` bytes at `offset` (they read as zeros), keeping the file's size, so a
    /// reader that maps the file never finds its pages gone (which would raise SIGBUS).
    /// Filesystems that cannot punch holes keep the bytes: they are garbage either way.
    pub fn punch_hole(&self, file: &File, path: &Path, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.change(
            || {
                use rustix::fs::FallocateFlags;
                let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
                match rustix::fs::fallocate(file, flags, offset, len) {
                    Err(e) if e == rustix::io::Errno::OPNOTSUPP => Ok(()),
                    other => other.map_err(io::Error::from),
                }
            },
            || Change::PunchHole { file: path.to_path_buf(), offset, len },
        )
    }

    /// Opens `path` read-write, creating it if it does not exist; says whether it was created.
    /// Never follows a symbolic link and never blocks on a FIFO (the caller checks the kind).
    pub fn open_or_create(&self, path: &Path) -> io::Result<(File, bool)> {
        let open = || OpenOptions::new().read(true).write(true).custom_flags(OPEN_FLAGS).clone();
        match open().open(path) {
            Ok(f) => Ok((f, false)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.change(
                || Ok((open().create_new(true).open(path)?, true)),
                || Change::Create { file: path.to_path_buf() },
            ),
            Err(e) => Err(e),
        }
    }

    /// Creates `path` anew for writing: a leftover file or symbolic link of that name is
    /// removed first (`unlink` never follows a link), and the creation is exclusive, so what is
    /// written lands in a new file inside the directory and nowhere else.
    pub fn create_exclusive(&self, path: &Path) -> io::Result<File> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        self.change(
            || {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .custom_flags(OPEN_FLAGS)
                    .open(path)
            },
            || Change::Create { file: path.to_path_buf() },
        )
    }

    /// Renames `from` to `to` unless `to` exists; `Ok(false)` if it does.
    pub fn rename_noreplace(&self, from: &Path, to: &Path) -> io::Result<bool> {
        let result = self.change(
            || {
                use rustix::fs::{renameat_with, RenameFlags, CWD};
                renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE).map_err(io::Error::from)
            },
            || Change::Rename { from: from.to_path_buf(), to: to.to_path_buf() },
        );
        match result {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Swaps the names `a` and `b` atomically (`renameat2(RENAME_EXCHANGE)`): both must exist.
    /// Fails with `EINVAL` on filesystems that cannot do it.
    pub fn rename_exchange(&self, a: &Path, b: &Path) -> io::Result<()> {
        self.change(
            || {
                use rustix::fs::{renameat_with, RenameFlags, CWD};
                renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(io::Error::from)
            },
            || Change::Exchange { a: a.to_path_buf(), b: b.to_path_buf() },
        )
    }

    /// `rename`.
    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.change(
            || std::fs::rename(from, to),
            || Change::Rename { from: from.to_path_buf(), to: to.to_path_buf() },
        )
    }

    /// `unlink`; `Ok(false)` if there was no such file.
    pub fn remove(&self, path: &Path) -> io::Result<bool> {
        let result = self
            .change(|| std::fs::remove_file(path), || Change::Remove { file: path.to_path_buf() });
        match result {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `fsync` of a directory, making its entries (creations, renames, removals) durable.
    pub fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.change(
            || File::open(dir).and_then(|d| d.sync_all()),
            || Change::SyncDir { dir: dir.to_path_buf() },
        )
    }
}

/// Replaces `dir/name` with `data`, durably and atomically (see [`Disk::write_durably`]): for
/// the files beside a store that the engine does not own (the Python layer's
/// `schema.msgpack`), so that every durable write of the project goes through one routine.
pub fn replace_file(dir: &Path, name: &str, data: &[u8]) -> Result<()> {
    Disk::default().write_durably(dir, &dir.join(name), data, data.len() as u64)
}

/// Renames `from` to `to` unless `to` exists (`Ok(false)` then), for the layers above the
/// engine, so that every rename of the project goes through the storage layer.
pub fn rename_noreplace(from: &Path, to: &Path) -> Result<bool> {
    Disk::default().rename_noreplace(from, to).map_err(|e| Error::io(from, e))
}

/// Swaps the names `a` and `b` atomically (see [`Disk::rename_exchange`]).
pub fn rename_exchange(a: &Path, b: &Path) -> Result<()> {
    Disk::default().rename_exchange(a, b).map_err(|e| Error::io(a, e))
}

/// Durable file creation, built from the changes above (so the journal sees every step).
impl Disk {
    /// Makes the new file `tmp` of `len` bytes (sparse past `data`) starting with `data`, synced.
    fn fill_temporary(&self, tmp: &Path, data: &[u8], len: u64) -> std::io::Result<()> {
        let f = self.create_exclusive(tmp)?;
        if len > data.len() as u64 {
            self.set_len(&f, tmp, len)?;
        }
        self.write_at(&f, tmp, 0, data)?;
        self.sync_file(&f, tmp)
    }

    /// Creates `path` holding `data` at the start of a `len`-byte file (sparse past `data`) unless
    /// it exists: built under a temporary name, synced, and renamed into place only if no other
    /// creator got there first (the first file made is the one every handle uses), so a concurrent
    /// creator or a crash never leaves a half-made one.
    pub fn create_once(&self, dir: &Path, path: &Path, data: &[u8], len: u64) -> Result<()> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let build = || -> std::io::Result<bool> {
            self.fill_temporary(&tmp, data, len)?;
            self.rename_noreplace(&tmp, path)
        };
        let result = build();
        if !matches!(result, Ok(true)) {
            let _ = std::fs::remove_file(&tmp);
        }
        match result {
            Ok(true) => self.sync_dir(dir).map_err(|e| Error::io(dir, e)),
            Ok(false) => Ok(()), // another creator won
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// Writes `data` at the start of a `len`-byte file (sparse past `data`) under a temporary name,
    /// syncs it, renames it to `path` and syncs the directory.
    pub fn write_durably(&self, dir: &Path, path: &Path, data: &[u8], len: u64) -> Result<()> {
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let write = || -> std::io::Result<()> {
            self.fill_temporary(&tmp, data, len)?;
            self.rename(&tmp, path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(path, e));
        }
        self.sync_dir(dir).map_err(|e| Error::io(dir, e))
    }
}
