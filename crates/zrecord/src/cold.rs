//! Records nothing has cached: reading them at the device's speed, and asking for them early.
//!
//! A gather copies records out of the chunk maps, which is memory speed when they are in the
//! page cache. When they are not, each copy would page-fault, and a fault reads one page (the
//! maps carry random-access advice, so not the kernel's megabytes of readahead) while the thread
//! waits: a batch would read its records one page at a time. So before copying, a gather probes
//! a few of its records with `mincore`; when one is not resident, the whole batch is read with
//! `pread` on the I/O pool instead, whose many threads keep that many reads in flight, each of
//! exactly a record's stored bytes (the chunk files carry `POSIX_FADV_RANDOM`), raw records
//! straight into the destination and compressed ones through a per-thread staging buffer.
//! Records that are resident after all are simply copied by the kernel.
//!
//! `prefetch` asks the kernel to start reading records a later gather will need
//! (`POSIX_FADV_WILLNEED` on each record's exact range) and returns at once: the loader issues
//! it for the batches after the ones it is building.

use std::sync::atomic::Ordering;

use crate::codec::Decoder;
use crate::error::Result;
use crate::format::{Codec, RecordLoc};
use crate::gather::{for_record, Slot};
use crate::pool::run_io;
use crate::store::Store;

/// Records probed per batch to decide whether it is in memory: a `mincore` each (about a
/// microsecond), against a warm batch's hundreds of microseconds of copying.
const PROBES: usize = 3;

/// Records probed per batch while the store's reads were going to the disk: readahead then
/// leaves batches partly read, and three resident records would send a batch whose other
/// records are still on the disk to the copy path, to be read a page per fault (the cold
/// loader ran at 0.66x of fio so, against 0.84x with readahead off). Against a cold batch's
/// milliseconds, 64 `mincore`s are nothing.
const COLD_PROBES: usize = 64;

/// Consecutive warm probes before the probe is throttled (see [`WARM_PROBE_INTERVAL_NS`]):
/// a store that just stopped finding records cold is still being read ahead into memory.
const WARM_STREAK: u32 = 16;

/// While gathers find their records in memory, the probe runs at most once per this many
/// nanoseconds: a loader of small records makes tens of thousands of gathers a second, and
/// three `mincore`s (1.2 µs here) were a fifth of a 256-label gather. Records that leave the
/// page cache in between are read by page faults -- correct, only slower -- until the next
/// probe, at most a millisecond later, sends the gathers to the cold path; while gathers find
/// records cold, every one probes.
const WARM_PROBE_INTERVAL_NS: u64 = 1_000_000;

/// Nanoseconds since the first call in this process (a monotonic clock read, ~25 ns).
fn now_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Whether gathers probe for records that are not in memory: `LOADERX_COLD_READS=0` turns the
/// probe off (every gather then copies from the maps, page-faulting what is not cached), for
/// data known to stay in memory and for measuring what the probe costs.
fn probing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LOADERX_COLD_READS").map_or(true, |v| v.trim() != "0"))
}

impl Store {
    /// Whether some of these records are probably not in memory: probes [`PROBES`] records
    /// spread over the batch, [`COLD_PROBES`] while the store's reads go to the disk and for
    /// [`WARM_STREAK`] gathers after; while warm, at most once per [`WARM_PROBE_INTERVAL_NS`].
    pub(crate) fn probably_cold(&self, slots: &[Slot<'_>]) -> bool {
        let n = slots.len();
        if n == 0 || !probing() {
            return false;
        }
        let was_cold = self.recently_cold.load(Ordering::Relaxed);
        let now = now_ns();
        if !was_cold && now < self.warm_until_ns.load(Ordering::Relaxed) {
            return false;
        }
        let settling = self.warm_streak.load(Ordering::Relaxed) < WARM_STREAK;
        let probes = if was_cold || settling { COLD_PROBES } else { PROBES };
        let cold = self.sample_is_cold(n, probes, |i| slots[i].loc);
        if was_cold != cold {
            self.recently_cold.store(cold, Ordering::Relaxed);
        }
        if cold {
            self.warm_streak.store(0, Ordering::Relaxed);
        } else if self.warm_streak.fetch_add(1, Ordering::Relaxed) + 1 >= WARM_STREAK {
            self.warm_until_ns.store(now.saturating_add(WARM_PROBE_INTERVAL_NS), Ordering::Relaxed);
        }
        cold
    }

    /// Fills every slot with `pread`s on the I/O pool, one record per task.
    pub(crate) fn read_slots_cold(&self, slots: &mut [Slot<'_>]) -> Result<()> {
        let dict = self.dictionary();
        let sums = self.checked_reads();
        let init = || (Decoder::new(dict), Vec::<u8>::new());
        run_io(slots, init, |(decoder, staging), s: &mut Slot<'_>| -> Result<()> {
            let Some((codec, chunk)) = self.locate(s.index, &s.loc)? else { return Ok(()) };
            let offset = u64::from(s.loc.offset);
            if codec == Codec::Raw && s.loc.phys_length as usize == s.dst.len() {
                chunk.read_into(offset, s.dst).map_err(|e| for_record(e, s.index))?;
            } else {
                staging.resize(s.loc.phys_length as usize, 0);
                chunk.read_into(offset, staging).map_err(|e| for_record(e, s.index))?;
                self.decode(s.index, &s.loc, codec, staging, s.dst, decoder)?;
            }
            self.check_sum(sums, s)
        })
    }

    /// Starts reading the records at `indices` into the page cache and returns without waiting
    /// (indices past the length are ignored: the batch they belong to will report them).
    /// Returns whether it asked for anything: records found cached by the probe (a few
    /// `mincore`s) cost no system call each.
    pub fn prefetch(&self, indices: &[u64]) -> Result<bool> {
        let _guard = self.activity.shared("prefetch")?;
        let len = self.len();
        let live: Vec<u64> = indices.iter().copied().filter(|&i| i < len).collect();
        if live.is_empty() || !self.sample_is_cold(live.len(), PROBES, |i| self.meta.entry(live[i]))
        {
            return Ok(false);
        }
        self.recently_cold.store(true, Ordering::Relaxed);
        let ranges = live.iter().map(|&i| {
            let loc = self.meta.entry(i);
            let start = u64::from(loc.offset);
            (u64::from(loc.chunk_id), start, start + u64::from(loc.phys_length))
        });
        // In file order, neighbours merged: fewer, larger requests, issued from the I/O pool's
        // threads at once: a `WILLNEED` waits while the device's queue is full, and hundreds
        // issued one after another held the caller (a loader's worker, about to gather its
        // own batch) for milliseconds.
        let mut spans = merge_spans(ranges, 0);
        run_io(
            &mut spans,
            || (),
            |(), &mut (chunk, start, end)| {
                if let Ok(c) = self.chunks.get(chunk) {
                    c.prefetch(start, end - start);
                }
                Ok::<(), crate::error::Error>(())
            },
        )?;
        Ok(true)
    }

    /// Whether one of `probes` records spread over `n` (table entries by `loc_of`, from the
    /// first to the last) is not in memory: the probe gathers and prefetches decide by. A
    /// chunk that cannot be opened counts as resident: the read that follows reports it,
    /// naming the record.
    fn sample_is_cold(&self, n: usize, probes: usize, loc_of: impl Fn(usize) -> RecordLoc) -> bool {
        // `probes` records spread evenly from the first to the last.
        let probes = probes.min(n).max(1);
        let picks = (0..probes).map(|k| if probes == 1 { 0 } else { k * (n - 1) / (probes - 1) });
        picks.into_iter().any(|i| {
            let loc = loc_of(i);
            self.chunks
                .get(u64::from(loc.chunk_id))
                .is_ok_and(|c| !c.resident(u64::from(loc.offset), u64::from(loc.phys_length)))
        })
    }

    /// Whether the last gather (or prefetch) of this handle found records that were not in
    /// memory: a loader uses it to read ahead only while reads go to the disk.
    pub fn recently_cold(&self) -> bool {
        self.recently_cold.load(Ordering::Relaxed)
    }
}

/// `(chunk, start, end)` byte ranges sorted and merged into spans: ranges of one chunk that
/// overlap or lie within `gap` bytes of each other become one. Empty ranges are dropped.
pub(crate) fn merge_spans(
    ranges: impl Iterator<Item = (u64, u64, u64)>,
    gap: u64,
) -> Vec<(u64, u64, u64)> {
    let mut ranges: Vec<(u64, u64, u64)> = ranges.filter(|r| r.2 > r.1).collect();
    ranges.sort_unstable();
    let mut spans: Vec<(u64, u64, u64)> = Vec::with_capacity(ranges.len());
    for (chunk, start, end) in ranges {
        match spans.last_mut() {
            Some(last) if last.0 == chunk && start <= last.2 + gap => last.2 = last.2.max(end),
            _ => spans.push((chunk, start, end)),
        }
    }
    spans
}
