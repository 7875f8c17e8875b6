//! Per-stage clocks of appends and syncs, for the write benchmark (`scripts/bench_write.py`):
//! where a conversion's time goes. Kept only with the `bench` feature; without it
//! [`timed`] is the call itself and [`snapshot`] reports nothing.
//!
//! Each stage adds the time its calls took on whichever thread ran them, so stages that run
//! on several threads at once (compressing, writing) add up to more than the wall time: they
//! are thread-seconds, to compare with the work's CPU cost on one core.

/// A stage of writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Compressing records (zstd), reading the caller's bytes included.
    Compress = 0,
    /// Placing records behind the frontier, under the sequencer's lock or serially.
    Plan = 1,
    /// Positional writes of record bytes (the copy into the page cache).
    Write = 2,
    /// `sync`: the `fdatasync`s and the header.
    Sync = 3,
    /// Record checksums (`sums.zr`).
    Checksum = 4,
    /// Whole `append` calls (wall time, on the calling thread).
    Append = 5,
}

/// The stages' names, in the order of their discriminants.
pub const STAGES: [&str; 6] = ["compress", "plan", "write", "sync", "checksum", "append"];

#[cfg(feature = "bench")]
mod clocks {
    use std::sync::atomic::{AtomicU64, Ordering};

    pub static NANOS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
    pub static CALLS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

    pub fn add(stage: usize, nanos: u64) {
        NANOS[stage].fetch_add(nanos, Ordering::Relaxed);
        CALLS[stage].fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `f`, adding its duration to `stage`'s clock (with the `bench` feature).
#[inline]
pub fn timed<T>(stage: Stage, f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "bench")]
    {
        let t = std::time::Instant::now();
        let out = f();
        clocks::add(stage as usize, t.elapsed().as_nanos() as u64);
        out
    }
    #[cfg(not(feature = "bench"))]
    {
        let _ = stage;
        f()
    }
}

/// Each stage's name, seconds and number of timed calls since the last reset; empty without
/// the `bench` feature. `reset` zeroes the clocks after reading them.
pub fn snapshot(reset: bool) -> Vec<(&'static str, f64, u64)> {
    #[cfg(feature = "bench")]
    {
        use std::sync::atomic::Ordering;
        STAGES
            .iter()
            .enumerate()
            .map(|(i, &name)| {
                let (nanos, calls) = if reset {
                    (
                        clocks::NANOS[i].swap(0, Ordering::Relaxed),
                        clocks::CALLS[i].swap(0, Ordering::Relaxed),
                    )
                } else {
                    (
                        clocks::NANOS[i].load(Ordering::Relaxed),
                        clocks::CALLS[i].load(Ordering::Relaxed),
                    )
                };
                (name, nanos as f64 * 1e-9, calls)
            })
            .collect()
    }
    #[cfg(not(feature = "bench"))]
    {
        let _ = reset;
        Vec::new()
    }
}
