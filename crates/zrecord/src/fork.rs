//! What a process forked from one holding store handles may still do with them.
//!
//! A child of `fork` has one thread: a mutex some other parent thread held at that instant stays
//! locked forever, and the parent's writer locks are shared with it (an `flock` belongs to the
//! open file description, which the child's copy of the descriptor also refers to). So:
//!
//! - a handler registered with `pthread_atfork` bumps a process-wide *fork epoch* in the child;
//!   a handle compares it with the epoch it was opened in (one relaxed load) and, when inherited,
//!   stays readable but refuses every write without touching the writer mutex;
//! - every writer-lock descriptor is listed in a fixed, lock-free table, and the same handler
//!   closes them all in the child, so a child never keeps the parent's writer lock alive after
//!   the parent has let it go.
#![expect(unsafe_code, reason = "registers a pthread_atfork handler and closes descriptors in it")]

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Once;

/// Writer locks one process can hold at once and still have them closed in forked children.
/// Past this many, a lock still works; a child then merely keeps that one alive while it lives.
const LOCK_SLOTS: usize = 256;

static FORK_EPOCH: AtomicU64 = AtomicU64::new(0);
static LOCK_FDS: [AtomicI32; LOCK_SLOTS] = [const { AtomicI32::new(-1) }; LOCK_SLOTS];
static REGISTER: Once = Once::new();

extern "C" fn in_child() {
    FORK_EPOCH.fetch_add(1, Ordering::Relaxed);
    for slot in &LOCK_FDS {
        let fd = slot.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: `close` is async-signal-safe, as an atfork child handler requires; the fd
            // was registered by `WriterLock` and, in this child, belongs to no one else: the
            // inheriting handle knows (through the epoch) not to close it again.
            unsafe { libc::close(fd) };
        }
    }
}

/// The current fork epoch (installs the handler on first use).
pub fn epoch() -> u64 {
    REGISTER.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no prepare/parent handlers;
        // the handler only touches atomics and calls `close`.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    FORK_EPOCH.load(Ordering::Relaxed)
}

/// Whether this process is a fork child of the one that read `opened` from [`epoch`].
pub fn inherited(opened: u64) -> bool {
    FORK_EPOCH.load(Ordering::Relaxed) != opened
}

/// Lists a writer-lock descriptor for closing in forked children. Returns its slot, if any.
pub(crate) fn register_lock_fd(fd: RawFd) -> Option<usize> {
    LOCK_FDS
        .iter()
        .position(|slot| slot.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok())
}

/// Takes a descriptor off the list before its owner closes it.
pub(crate) fn unregister_lock_fd(slot: usize, fd: RawFd) {
    let _ = LOCK_FDS[slot].compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
}
