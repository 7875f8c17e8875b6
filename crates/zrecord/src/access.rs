//! Who may touch a store at once.
//!
//! In one process: gather, append, lengths and stats are *shared* calls and may overlap freely;
//! delete and compact are *exclusive* and are refused while any other call is in flight (and
//! shared calls are refused while one runs). A counter with one high bit for "exclusive" does it
//! without a lock on the read path.
//!
//! Across processes: the first write (append, delete, compact, train_dict) takes an advisory
//! `flock` on `meta.zr`, held until the handle closes: one writer process at a time, any number
//! of readers. A forked child inherits the lock but must not write through it (its in-memory tail
//! would race the parent's), so writes check the pid that took the lock.

use std::fs::File;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};

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

/// The cross-process writer lock, once taken.
pub struct WriterLock {
    pid: u32,
}

impl WriterLock {
    /// Takes the lock on `meta` without waiting.
    pub fn acquire(meta: &File, path: &std::path::Path) -> Result<WriterLock> {
        match meta.try_lock() {
            Ok(()) => Ok(WriterLock { pid: std::process::id() }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::Busy(format!(
                "another process or handle holds the writer lock on {}",
                path.display()
            ))),
            Err(std::fs::TryLockError::Error(e)) => Err(Error::io(path, e)),
        }
    }

    /// Refuses a write from a process other than the one that took the lock.
    pub fn check_pid(&self) -> Result<()> {
        if self.pid == std::process::id() {
            Ok(())
        } else {
            Err(Error::Busy(
                "this store handle was opened for writing in the parent process; reopen the store \
                 in the child to write"
                    .into(),
            ))
        }
    }
}
