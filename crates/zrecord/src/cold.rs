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
use crate::format::Codec;
use crate::gather::{for_record, Slot};
use crate::pool::run_io;
use crate::store::Store;

/// Records probed per batch to decide whether it is in memory: a `mincore` each (about a
/// microsecond), against a warm batch's hundreds of microseconds of copying.
const PROBES: usize = 3;

/// Whether gathers probe for records that are not in memory: `LOADERX_COLD_READS=0` turns the
/// probe off (every gather then copies from the maps, page-faulting what is not cached), for
/// data known to stay in memory and for measuring what the probe costs.
fn probing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LOADERX_COLD_READS").map_or(true, |v| v.trim() != "0"))
}

impl Store {
    /// Whether some of these records are probably not in memory: probes the first, the middle
    /// and the last record of the batch.
    pub(crate) fn probably_cold(&self, slots: &[Slot<'_>]) -> bool {
        let n = slots.len();
        if n == 0 || !probing() {
            return false;
        }
        let picks = [0, n / 2, n - 1];
        let cold = picks.iter().take(PROBES.min(n)).any(|&i| {
            let loc = &slots[i].loc;
            match self.chunks.get(u64::from(loc.chunk_id)) {
                Ok(chunk) => !chunk.resident(u64::from(loc.offset), u64::from(loc.phys_length)),
                Err(_) => false, // the copy path reports it, naming the record
            }
        });
        if self.recently_cold.load(Ordering::Relaxed) != cold {
            self.recently_cold.store(cold, Ordering::Relaxed);
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
        let n = live.len();
        let cached = |&i: &usize| {
            let loc = self.meta.entry(live[i]);
            self.chunks
                .get(u64::from(loc.chunk_id))
                .is_ok_and(|c| c.resident(u64::from(loc.offset), u64::from(loc.phys_length)))
        };
        if n == 0 || [0, n / 2, n - 1].iter().take(PROBES).all(cached) {
            return Ok(false);
        }
        self.recently_cold.store(true, Ordering::Relaxed);
        let mut ranges: Vec<(u16, u64, u64)> = live
            .iter()
            .map(|&i| {
                let loc = self.meta.entry(i);
                (loc.chunk_id, u64::from(loc.offset), u64::from(loc.phys_length))
            })
            .filter(|r| r.2 > 0)
            .collect();
        // In file order, neighbours merged: fewer, larger requests.
        ranges.sort_unstable();
        let mut merged: Vec<(u16, u64, u64)> = Vec::with_capacity(ranges.len());
        for (chunk, start, len) in ranges {
            match merged.last_mut() {
                Some(last) if last.0 == chunk && start <= last.1 + last.2 => {
                    last.2 = last.2.max(start + len - last.1);
                }
                _ => merged.push((chunk, start, len)),
            }
        }
        for (chunk, start, len) in merged {
            if let Ok(c) = self.chunks.get(u64::from(chunk)) {
                c.prefetch(start, len);
            }
        }
        Ok(true)
    }

    /// Whether the last gather (or prefetch) of this handle found records that were not in
    /// memory: a loader uses it to read ahead only while reads go to the disk.
    pub fn recently_cold(&self) -> bool {
        self.recently_cold.load(Ordering::Relaxed)
    }
}
