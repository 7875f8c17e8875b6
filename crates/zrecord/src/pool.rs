//! The persistent worker pools: one that shards a batch across cores, and one of many threads
//! that wait on the disk for records nothing has cached (`run_io`).
//!
//! One rayon pool of each kind per process, built on first use. A forked child inherits the
//! parent's pool objects but none of their threads, so each remembers the pid that built it and
//! a child builds its own on first use (the parent's is leaked: dropping it would wait on
//! threads that do not exist). No thread is ever created per call.
//!
//! The compute pool's size comes from `LOADERX_NUM_THREADS` when set, else from the available
//! parallelism; [`set_num_threads`] changes it for later calls. The I/O pool has
//! `LOADERX_IO_THREADS` threads (default [`DEFAULT_IO_THREADS`]).
#![expect(
    unsafe_code,
    reason = "the pool slot is a leaked box behind an atomic pointer, so a forked child never blocks on it"
)]

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use rayon::{ThreadPool, ThreadPoolBuilder};

struct PoolSlot {
    pid: u32,
    threads: usize,
    pool: Option<ThreadPool>,
}

/// The pool that shards work across cores.
static SLOT: AtomicPtr<PoolSlot> = AtomicPtr::new(std::ptr::null_mut());
/// The pool that reads cold records: its threads mostly sleep in `pread`.
static IO_SLOT: AtomicPtr<PoolSlot> = AtomicPtr::new(std::ptr::null_mut());
static WANTED_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Threads of the I/O pool unless `LOADERX_IO_THREADS` says otherwise: enough reads in flight
/// to keep a solid-state device's queue full, with no extra memory per read.
pub const DEFAULT_IO_THREADS: usize = 32;

/// Batches smaller than this many bytes are not worth waking another thread for.
pub const MIN_SHARD_BYTES: usize = 96 * 1024;

/// The default thread count, computed once: `available_parallelism` reads cgroup files on
/// every call, which would cost tens of microseconds per batch.
fn default_threads() -> usize {
    static DEFAULT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *DEFAULT.get_or_init(detect_threads)
}

fn detect_threads() -> usize {
    std::env::var("LOADERX_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

/// Number of threads batches are split across (1 means every call runs inline).
pub fn num_threads() -> usize {
    match WANTED_THREADS.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

/// Sets the number of threads for later calls; 0 restores the default.
pub fn set_num_threads(n: usize) {
    WANTED_THREADS.store(n, Ordering::Relaxed);
}

/// Threads of the pool that reads cold records.
pub fn io_threads() -> usize {
    static IO: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *IO.get_or_init(|| {
        std::env::var("LOADERX_IO_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_IO_THREADS)
    })
}

fn current_pool() -> Option<&'static ThreadPool> {
    pool_in(&SLOT, num_threads(), "loaderx")
}

/// The pool of `slot`, sized `threads`, built in this process if it was not yet (a forked
/// child has none of its parent's threads).
fn pool_in(
    slot: &'static AtomicPtr<PoolSlot>,
    threads: usize,
    name: &'static str,
) -> Option<&'static ThreadPool> {
    let pid = std::process::id();
    if threads <= 1 {
        return None;
    }
    let cur = slot.load(Ordering::Acquire);
    if !cur.is_null() {
        // Slots are leaked boxes: never freed, so a reference to one is 'static.
        let installed: &'static PoolSlot = leak_ref(cur);
        if installed.pid == pid && installed.threads == threads {
            return installed.pool.as_ref();
        }
    }
    // First use in this process (or a changed size): build and install. A thread that loses the
    // race uses the winner's pool; its own is dropped here, in the process that built it.
    let pool = ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .ok();
    let fresh = Box::into_raw(Box::new(PoolSlot { pid, threads, pool }));
    match slot.compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => leak_ref(fresh).pool.as_ref(),
        Err(winner) => {
            reclaim(fresh);
            let installed = leak_ref(winner);
            (installed.pid == pid).then_some(()).and(installed.pool.as_ref())
        }
    }
}

/// Runs `work` on every item on the I/O pool, one item per task, with a per-thread state made
/// by `init` (decoders, a staging buffer). For reads that wait on the disk: the pool's many
/// threads keep that many reads in flight. Returns the first error.
pub fn run_io<T, S, E, I, F>(items: &mut [T], init: I, work: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, &mut T) -> Result<(), E> + Sync + Send,
{
    use rayon::prelude::*;
    match pool_in(&IO_SLOT, io_threads(), "loaderx-io") {
        None => {
            let mut state = init();
            items.iter_mut().try_for_each(|item| work(&mut state, item))
        }
        Some(pool) => pool.install(|| {
            items
                .par_iter_mut()
                .with_max_len(1)
                .try_for_each_init(&init, |state, item| work(state, item))
        }),
    }
}

fn leak_ref(p: *mut PoolSlot) -> &'static PoolSlot {
    // SAFETY: every pointer stored in SLOT comes from Box::into_raw and is never freed once
    // installed, so it is valid for 'static.
    unsafe { &*p }
}

/// Frees a slot that lost the install race.
fn reclaim(p: *mut PoolSlot) {
    // SAFETY: `p` came from Box::into_raw in this call and lost the install race, so nothing
    // else can see it.
    drop(unsafe { Box::from_raw(p) });
}

/// Splits `items` into at most [`num_threads`] contiguous blocks and runs `work` on each, in
/// parallel when `total_bytes` makes it worthwhile, else inline on the calling thread. The
/// calling thread takes the first block itself rather than sleeping while the pool works, which
/// saves a wake-up on the critical path. Returns the first error any block reported.
pub fn run_sharded<T, E, F>(items: &mut [T], total_bytes: usize, work: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(&mut [T]) -> Result<(), E> + Sync,
{
    run_sharded_at_most(items, total_bytes, usize::MAX, work)
}

/// [`run_sharded`] with at most `max_shards` blocks: a caller that already runs several such
/// calls side by side (a loader's prefetch threads) asks for fewer, so that callers times
/// shards stays near the number of cores. `max_shards <= 1` runs inline.
pub fn run_sharded_at_most<T, E, F>(
    items: &mut [T],
    total_bytes: usize,
    max_shards: usize,
    work: F,
) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(&mut [T]) -> Result<(), E> + Sync,
{
    let by_bytes = total_bytes / MIN_SHARD_BYTES;
    let shards = num_threads().min(max_shards).min(items.len()).min(by_bytes.max(1));
    run_blocks(items, shards, work)
}

/// [`run_sharded`] for work whose cost per item varies (compression: some records take far
/// longer than others): several blocks per thread, taken by whichever thread is free, so that
/// one slow block does not leave the other cores idle at the end.
pub fn run_balanced<T, E, F>(items: &mut [T], total_bytes: usize, work: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(&mut [T]) -> Result<(), E> + Sync,
{
    const BLOCKS_PER_THREAD: usize = 4;
    let by_bytes = total_bytes / MIN_SHARD_BYTES;
    let threads = num_threads();
    let shards = if threads <= 1 { 1 } else { threads * BLOCKS_PER_THREAD };
    run_blocks(items, shards.min(items.len()).min(by_bytes.max(1)), work)
}

/// Runs `work` on `workers` threads at once, the calling thread being one of them, and
/// returns the first error any reported. For work that pulls its own items from a shared
/// counter (the append pipeline): each call of `work` is one worker, living as long as there
/// are items. Inline on the calling thread when `workers <= 1` or there is no pool.
pub fn run_workers<E, F>(workers: usize, work: F) -> Result<(), E>
where
    E: Send,
    F: Fn() -> Result<(), E> + Sync,
{
    let mut slots = vec![(); workers.max(1)];
    run_blocks(&mut slots, workers, |_: &mut [()]| work())
}

/// Runs `work` on `shards` contiguous blocks of `items` on the compute pool, the calling
/// thread taking the first; inline when `shards <= 1` or there is no pool.
fn run_blocks<T, E, F>(items: &mut [T], shards: usize, work: F) -> Result<(), E>
where
    T: Send,
    E: Send,
    F: Fn(&mut [T]) -> Result<(), E> + Sync,
{
    if shards <= 1 {
        return work(items);
    }
    let Some(pool) = current_pool() else {
        return work(items);
    };
    let per = items.len().div_ceil(shards);
    let mut blocks = items.chunks_mut(per);
    let first = blocks.next();
    let failure = std::sync::Mutex::new(None);
    let record = |r: Result<(), E>| {
        if let Err(e) = r {
            failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(e);
        }
    };
    pool.in_place_scope(|scope| {
        for block in blocks {
            let (work, record) = (&work, &record);
            scope.spawn(move |_| record(work(block)));
        }
        if let Some(block) = first {
            record(work(block));
        }
    });
    match failure.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::{run_balanced, run_sharded, run_workers, set_num_threads};

    /// Every item is worked on exactly once, whatever the thread count and block split.
    #[test]
    fn every_item_once_and_the_first_error_reported() {
        for threads in [1, 2, 3] {
            set_num_threads(threads);
            for n in [0usize, 1, 7, 100, 1001] {
                let mut items = vec![0u32; n];
                run_balanced(&mut items, n << 20, |b: &mut [u32]| -> Result<(), ()> {
                    for x in b.iter_mut() {
                        *x += 1;
                    }
                    Ok(())
                })
                .unwrap();
                assert!(items.iter().all(|&x| x == 1), "{threads} threads, {n} items");
                run_sharded(&mut items, n << 20, |b: &mut [u32]| -> Result<(), ()> {
                    for x in b.iter_mut() {
                        *x += 1;
                    }
                    Ok(())
                })
                .unwrap();
                assert!(items.iter().all(|&x| x == 2));
            }
            let mut items: Vec<u32> = (0..1000).collect();
            let failed =
                run_balanced(
                    &mut items,
                    1 << 30,
                    |b: &mut [u32]| {
                        if b.contains(&500) {
                            Err(500)
                        } else {
                            Ok(())
                        }
                    },
                );
            assert_eq!(failed, Err(500));
            // Workers pull items until none is left; each item is taken once.
            let next = std::sync::atomic::AtomicUsize::new(0);
            let seen = std::sync::Mutex::new(Vec::new());
            run_workers(threads, || -> Result<(), ()> {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= 100 {
                        return Ok(());
                    }
                    seen.lock().unwrap().push(i);
                }
            })
            .unwrap();
            let mut seen = seen.into_inner().unwrap();
            seen.sort_unstable();
            assert_eq!(seen, (0..100).collect::<Vec<_>>());
            assert_eq!(run_workers(threads, || Err::<(), _>(7)), Err(7));
        }
        set_num_threads(0);
    }
}
