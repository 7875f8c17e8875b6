//! Joining stores: a new, empty store takes the records of several stores, in order, without
//! copying a byte of them. Their chunk files are hard-linked into it under new numbers (part
//! `p`'s chunk `c` becomes chunk `base(p) + c`, `base(p)` the chunks of the parts before it)
//! and their table entries are written with the chunk numbers moved by the same amount, so the
//! joined store reads exactly as one store written in one go -- one table, one set of checks
//! per read -- while the join costs a table write and a link per chunk.
//!
//! The format allows it as it is: a record never straddles chunks, bytes of a chunk that no
//! entry covers are garbage, and only the last chunk holds the frontier, so a part's
//! unfilled last chunk is simply garbage past its records. The joined store's frontier is the
//! last non-empty part's, moved; appends continue there.
//!
//! Refused before anything is written: a destination that is not empty, a part with records not
//! yet synced, parts of another chunk
//! capacity, parts with a zstd dictionary (each has its own; codec-2 records could not all
//! decode against one), more than [`MAX_RECORDS`] records or [`MAX_CHUNKS`] chunks in all, and
//! a part whose table names a chunk past its own frontier (in the joined store it would name
//! the next part's bytes). A failure part-way leaves the destination incomplete: the caller
//! builds it in a private directory and removes it then (the parts are never modified).
//! Checksums (`sums.zr`) follow their records: a part's sum that is bound to its entry is
//! bound to the moved entry; parts without checksums leave their records unchecked.

use crate::error::{Error, Result};
use crate::format::{chunk_file_name, RecordLoc, SumEntry, MAX_CHUNKS, MAX_RECORDS};
use crate::store::Store;
use crate::sums::{binding, Sums};

/// Table entries moved per write.
const BLOCK: u64 = 1 << 16;

/// What one part brings: its records and the chunks they lie in.
struct Plan<'a> {
    part: &'a Store,
    len: u64,
    /// Chunks `0..chunks` hold its records (its tail chunk only when something is in it).
    chunks: u64,
    /// Where its chunk 0 goes in the joined store.
    base: u64,
}

impl Store {
    /// Makes this store, which must be empty and have no chunk files, the concatenation of
    /// `parts` (records of `parts[0]`, then of `parts[1]`, ...), linking their chunk files in
    /// (see the module docs). The parts are only read; their records stay where they are, now
    /// shared by both stores' files. Durable on return.
    ///
    /// # Errors
    /// What the module docs list, as `InvalidArgument`, `LimitExceeded` or `Corrupt` naming the
    /// part, before anything is written; I/O errors (`EXDEV` when a part is on another file
    /// system, which hard links cannot cross) after.
    pub fn join_from(&self, parts: &[&Store]) -> Result<()> {
        let _guard = self.activity.exclusive("join")?;
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        if self.len.get() != 0 || state.tail_chunk != 0 || state.tail_offset != 0 {
            return Err(Error::invalid(format!(
                "{} is not empty: stores are joined into a new store",
                self.dir.display()
            )));
        }
        if self.has_dict() {
            return Err(Error::invalid("stores are joined into a store without a dictionary"));
        }
        let plans = self.plan_join(parts)?;
        for plan in &plans {
            plan.part.check_entries_within(plan.len, plan.chunks)?;
        }
        for plan in &plans {
            for c in 0..plan.chunks {
                let from = plan.part.dir.join(chunk_file_name(c));
                let to = self.dir.join(chunk_file_name(plan.base + c));
                match std::fs::hard_link(&from, &to) {
                    Ok(()) => {}
                    // A chunk the part never wrote to (its frontier moved past it): none here.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && !from.exists() => {}
                    Err(e) => return Err(Error::io(&to, e)),
                }
            }
        }
        self.chunks.mark_names_changed();
        self.chunks.revalidate();
        let sums = if parts.iter().any(|p| p.has_checksums()) {
            Some(Sums::create(&self.dir, &self.disk)?)
        } else {
            None
        };
        let mut first = 0u64;
        for plan in &plans {
            self.write_moved_entries(plan, first, sums.as_ref())?;
            first += plan.len;
        }
        // The frontier: the last part with bytes in its chunks, moved with them.
        if let Some(last) = plans.iter().rev().find(|p| p.chunks > 0) {
            let h = last.part.meta.header();
            state.tail_chunk = last.base + u64::from(h.tail_chunk);
            state.tail_offset = u64::from(h.tail_offset);
        }
        state.dirty_table = true;
        if let Some(sums) = sums {
            sums.sync(&self.disk)?;
            let _ = self.sums.set(sums);
        }
        self.len.publish(u32::try_from(first).map_err(|_| Error::internal("join length"))?);
        self.sync_locked(&mut state)
    }

    /// Each part's records and chunks, checked against the limits of one store.
    fn plan_join<'a>(&self, parts: &[&'a Store]) -> Result<Vec<Plan<'a>>> {
        let (mut base, mut records) = (0u64, 0u64);
        let mut plans = Vec::with_capacity(parts.len());
        for part in parts {
            if part.chunks.capacity() != self.chunks.capacity() {
                return Err(Error::invalid(format!(
                    "{} has chunks of {} bytes, the joined store {}",
                    part.dir.display(),
                    part.chunks.capacity(),
                    self.chunks.capacity()
                )));
            }
            if part.has_dict() {
                return Err(Error::invalid(format!(
                    "{} has a zstd dictionary of its own: stores with dictionaries are not \
                     joined (store them with codec zstd or raw)",
                    part.dir.display()
                )));
            }
            let h = part.meta.header();
            let len = u64::from(h.length);
            if part.len() != len {
                // What a writing handle appended but did not sync is in no header yet.
                return Err(Error::invalid(format!(
                    "{} holds {} records, {len} of them synced: sync it before joining it",
                    part.dir.display(),
                    part.len()
                )));
            }
            let chunks = u64::from(h.tail_chunk) + u64::from(h.tail_offset > 0);
            plans.push(Plan { part, len, chunks, base });
            base += chunks;
            records += len;
        }
        if records > MAX_RECORDS {
            return Err(Error::LimitExceeded {
                what: "records in one store",
                limit: MAX_RECORDS,
                requested: records,
            });
        }
        // The frontier may stand at chunk MAX_CHUNKS only when the last chunk is filled.
        if base > MAX_CHUNKS {
            return Err(Error::LimitExceeded {
                what: "chunks in one store",
                limit: MAX_CHUNKS,
                requested: base,
            });
        }
        Ok(plans)
    }

    /// Checks that every live entry below `len` names a chunk below `chunks`.
    fn check_entries_within(&self, len: u64, chunks: u64) -> Result<()> {
        for i in 0..len {
            let e = self.meta.entry(i);
            if u64::from(e.chunk_id) >= chunks {
                return Err(Error::corrupt(
                    &self.meta_path,
                    format!(
                        "record {i} names chunk {} past the store's last chunk ({})",
                        e.chunk_id,
                        chunks.saturating_sub(1)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `plan`'s entries, chunk numbers moved, into this store's table from `first` (and their
    /// checksums, rebound, into `sums`).
    fn write_moved_entries(&self, plan: &Plan<'_>, first: u64, sums: Option<&Sums>) -> Result<()> {
        let theirs = plan.part.sums.get();
        let mut start = 0;
        while start < plan.len {
            let end = (start + BLOCK).min(plan.len);
            let (mut entries, mut moved_sums) = (Vec::new(), Vec::new());
            for i in start..end {
                let old = plan.part.meta.entry(i);
                // Below MAX_CHUNKS (plan_join), so the sum fits the u16.
                let chunk = u16::try_from(u64::from(old.chunk_id) + plan.base)
                    .map_err(|_| Error::internal("joined chunk number"))?;
                let new = RecordLoc { chunk_id: chunk, ..old };
                if sums.is_some() {
                    moved_sums.push(match theirs.map(|s| s.entry(i)) {
                        Some(s) if s.binding == binding(&old) => {
                            SumEntry { sum: s.sum, binding: binding(&new) }
                        }
                        _ => SumEntry::default(),
                    });
                }
                entries.push(new);
            }
            self.write_entries(first + start, &entries)?;
            if let Some(sums) = sums {
                sums.write(&self.disk, first + start, &moved_sums)?;
            }
            start = end;
        }
        Ok(())
    }
}
