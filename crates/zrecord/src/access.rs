//! Who may touch a store at once.
//!
//! In one process: gather, append, lengths and stats are *shared* calls and may overlap freely;
//! delete and compact are *exclusive* and are refused while any other call is in flight (and
//! shared calls are refused while one runs). A counter with one high bit for "exclusive" does it
//! without a lock on the read path.
//!
//! Across handles and processes: the first write (append, delete, compact, `train_dict`,
//! `enable_checksums`) takes an advisory `flock` on `meta.zr`, held until the handle closes: one
//! writer at a time, any number of readers. The lock is taken through a file description of its
//! own, opened for the purpose, so two handles in one process, or a parent and a child that
//! both opened it after a `fork`, exclude each other like two processes do. Before locking, the
//! file opened is checked to be the very `meta.zr` the handle maps (a store replaced under the
//! same name is refused), and again after, since a replacement may land in between.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};
use crate::files;
use crate::fork;

const EXCLUSIVE: u32 = 1 << 31;

/// Count of calls in flight, plus the exclusive bit.
#[derive(Default)]
pub struct Activity {
    state: AtomicU32,
}

/// Proof that a call is registered; dropping it ends the call.
pub struct Guard<'a> {
    activity: &'a Activity,
    exclusive: bool,
}

impl Activity {
    /// Registers a shared call.
    pub fn shared(&self, op: &str) -> Result<Guard<'_>> {
        let before = self.state.fetch_add(1, Ordering::Acquire);
        if before & EXCLUSIVE != 0 {
            self.state.fetch_sub(1, Ordering::Release);
            return Err(Error::Busy(format!("{op} refused while delete or compact is running")));
        }
        Ok(Guard { activity: self, exclusive: false })
    }

    /// Registers an exclusive call; refused while anything else is in flight.
    pub fn exclusive(&self, op: &str) -> Result<Guard<'_>> {
        match self.state.compare_exchange(0, EXCLUSIVE, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Ok(Guard { activity: self, exclusive: true }),
            Err(now) => Err(Error::Busy(format!(
                "{op} needs exclusive access but {} other call(s) are in flight on this store",
                now & !EXCLUSIVE
            ))),
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if self.exclusive {
            self.activity.state.fetch_and(!EXCLUSIVE, Ordering::Release);
        } else {
            self.activity.state.fetch_sub(1, Ordering::Release);
        }
    }
}

/// The error of a write through a handle inherited across `fork`.
pub fn inherited_handle() -> Error {
    Error::Busy(
        "this store handle was inherited across fork; it can read, but only a handle opened in \
         this process can write: open the store again here"
            .into(),
    )
}

/// The cross-process writer lock, once taken.
pub struct WriterLock {
    file: Option<File>,
    /// Its place in the fork module's table, if it got one.
    slot: Option<usize>,
    fork_epoch: u64,
}

impl WriterLock {
    /// Takes the lock on the `meta.zr` named `path`, which must be the file whose identity is
    /// `expected`, without waiting.
    pub fn acquire(path: &Path, expected: (u64, u64)) -> Result<WriterLock> {
        let replaced = || {
            Error::Changed(format!(
                "{} is no longer this handle's store (it was replaced or removed); open the \
                 store again",
                path.display()
            ))
        };
        let file = files::open_existing(path, false)?.ok_or_else(replaced)?;
        if files::identity(&file).map_err(|e| Error::io(path, e))? != expected {
            return Err(replaced());
        }
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Busy(format!(
                    "another process or handle holds the writer lock on {}",
                    path.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(path, e)),
        }
        if files::identity_of_name(path).map_err(|e| Error::io(path, e))? != Some(expected) {
            return Err(replaced());
        }
        let slot = fork::register_lock_fd(file.as_raw_fd());
        Ok(WriterLock { file: Some(file), slot, fork_epoch: fork::epoch() })
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        let Some(file) = self.file.take() else { return };
        match self.slot {
            // The fork handler already closed a listed descriptor in this child; its number may
            // belong to another file by now.
            Some(_) if fork::inherited(self.fork_epoch) => std::mem::forget(file),
            Some(slot) => {
                fork::unregister_lock_fd(slot, file.as_raw_fd());
                drop(file);
            }
            None => drop(file),
        }
    }
}
