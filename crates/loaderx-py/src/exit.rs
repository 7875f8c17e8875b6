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

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use pyo3::marker::Ungil;
use pyo3::prelude::*;

static EXITING: AtomicBool = AtomicBool::new(false);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` with the interpreter released, unless the interpreter is exiting (then holding it).
pub fn detach<T: Ungil, F: Ungil + FnOnce() -> T>(py: Python<'_>, f: F) -> T {
    // SeqCst on both sides (here: count, then look at the flag; in begin_exit: flag, then look
    // at the count) guarantees that one of the two sees the other.
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let out = if EXITING.load(Ordering::SeqCst) { f() } else { py.detach(f) };
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    out
}

/// Called at interpreter exit (`atexit`): waits until no native call runs detached, and makes
/// later calls keep the interpreter.
#[pyfunction]
pub fn begin_exit(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    while IN_FLIGHT.load(Ordering::SeqCst) > 0 {
        // Released while waiting, so the calls in flight can take the interpreter back.
        py.detach(|| std::thread::sleep(Duration::from_millis(1)));
    }
}
