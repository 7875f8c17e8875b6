//! Leaving the interpreter while other threads are inside native calls.
//!
//! A thread that releases the interpreter for a native call takes it back when the call ends.
//! If the interpreter began finalizing meanwhile, `CPython` (before 3.14) ends that thread with
//! `pthread_exit`, whose forced unwinding through Rust frames aborts the whole process
//! ("FATAL: exception not rethrown"). So every call releases the interpreter through [`detach`],
//! which counts the calls in flight, and `loaderx` registers [`begin_exit`] with `atexit`: it
//! waits for the calls in flight to finish (before finalization starts, while they can still
//! take the interpreter back), and from then on calls keep the interpreter instead of releasing
//! it, so finalization waits for them rather than killing them half-way.
//!
//! The count belongs to one process: a child of `fork` has only the forking thread, so calls
//! that other parent threads had in flight never end there. The counter is therefore tagged with
//! the fork epoch it counts in (`zrecord::fork`), and a count from an earlier epoch is zero.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use pyo3::marker::Ungil;
use pyo3::prelude::*;

static EXITING: AtomicBool = AtomicBool::new(false);
/// Fork epoch (high 32 bits) and the calls in flight in it (low 32 bits).
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);

fn tag() -> u64 {
    zrecord::fork::epoch() << 32
}

/// The calls in flight in this process.
fn in_flight() -> u64 {
    let state = IN_FLIGHT.load(Ordering::SeqCst);
    if state & !u64::from(u32::MAX) == tag() {
        state & u64::from(u32::MAX)
    } else {
        0
    }
}

/// Counts a call in; returns the tag it was counted under.
fn enter() -> u64 {
    let tag = tag();
    let _ = IN_FLIGHT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
        let count =
            if state & !u64::from(u32::MAX) == tag { state & u64::from(u32::MAX) } else { 0 };
        Some(tag | (count + 1))
    });
    tag
}

/// Counts a call out, unless the process forked since it was counted in (then the count it
/// was part of belongs to the parent).
fn leave(tag: u64) {
    let _ = IN_FLIGHT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
        (state & !u64::from(u32::MAX) == tag && state & u64::from(u32::MAX) > 0).then(|| state - 1)
    });
}

/// Runs `f` with the interpreter released, unless the interpreter is exiting (then holding it).
pub fn detach<T: Ungil, F: Ungil + FnOnce() -> T>(py: Python<'_>, f: F) -> T {
    // SeqCst on both sides (here: count, then look at the flag; in begin_exit: flag, then look
    // at the count) guarantees that one of the two sees the other.
    let tag = enter();
    let out = if EXITING.load(Ordering::SeqCst) { f() } else { py.detach(f) };
    leave(tag);
    out
}

/// Called at interpreter exit (`atexit`): waits until no native call of this process runs
/// detached, and makes later calls keep the interpreter.
#[pyfunction]
pub fn begin_exit(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    while in_flight() > 0 {
        // Released while waiting, so the calls in flight can take the interpreter back.
        py.detach(|| std::thread::sleep(Duration::from_millis(1)));
    }
}
