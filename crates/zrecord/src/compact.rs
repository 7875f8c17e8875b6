//! `compact`: reclaim the bytes of deleted records by repacking the live records in place.
//!
//! Records are visited in physical order (chunk, offset) and packed densely from the start of
//! chunk 0, so none moves to a higher address and a write never lands on a record not yet moved:
//! no copy of the store is needed. Records already in place are skipped.
//!
//! A record's new place may overlap its old one (whenever less garbage than the record's size
//! lies before it), so a record is never copied straight to its new place. Moves go in batches,
//! each through a staging area past the append frontier: (1) copy the batch to staging, sync,
//! advance the header's frontier past the staging area, sync, point its entries there, sync;
//! (2) copy the batch to its final places, sync, point the entries there, sync. At every instant
//! each durable entry points at durable, intact bytes, so a compaction interrupted at any point
//! (error, kill or power loss) leaves a store with the same records, and running `compact` again
//! finishes the job.
//!
//! Readers in other handles and processes take no lock: before each batch overwrites stored
//! bytes, `gen.zr`'s epoch advances, and a read that overlapped it reads again (`epoch.rs`).
//! Files are never shrunk (space past the frontier becomes a hole), so a reader's map of a
//! chunk never loses a page under it.

use std::collections::BTreeSet;

use crate::cold::merge_spans;
use crate::error::{Error, Result};
use crate::format::{chunk_file_name, RecordLoc, SumEntry, MAX_CHUNKS};
use crate::frontier::Frontier;
use crate::store::{Store, WriterState};
use crate::sums::binding;

/// Most bytes moved per batch (each batch costs four syncs).
const BATCH_BYTES: u64 = 64 << 20;
/// Page size, the unit the page cache drops.
const PAGE: u64 = 4096;

/// What a compaction did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Distinct stored records moved.
    pub moved: u64,
    /// Records already in place.
    pub skipped: u64,
    /// Chunk bytes below the frontier before and after.
    pub chunk_bytes_before: u64,
    /// See `chunk_bytes_before`.
    pub chunk_bytes_after: u64,
    /// Chunk files deleted.
    pub chunks_removed: u64,
}

/// One stored record to move, and every table entry that points at it (more than one only after
/// a crash in the middle of a delete).
struct Move {
    indices: Vec<u64>,
    old: RecordLoc,
    dest: (u64, u64),
}

/// A batch of moves with their bytes and staging places.
#[derive(Default)]
struct Batch {
    moves: Vec<(Move, (u64, u64))>,
    bytes: Vec<u8>,
    /// Whether each record was in memory before the move (some reader has it hot).
    hot: Vec<bool>,
}

/// The plan of a compaction (pure).
struct Plan {
    /// Records whose bytes move down to their packed place.
    moves: Vec<Move>,
    /// Empty records whose entries only take their packed place (no bytes move): left where
    /// they were, they could lie past the new frontier, where no entry may point.
    relabels: Vec<Move>,
    /// Records already in place.
    skipped: u64,
    /// The frontier after the packed records.
    end: Frontier,
}

/// Plans a compaction: the live records, sorted by place, packed from the start of chunk 0
/// with the append rule ([`Frontier::place`]); records that share their bytes move together.
/// `Err(index)` names a record that would move *up* (its place overlaps another's: the table is
/// corrupt, and moving it could destroy data).
fn plan(live: &[(u64, RecordLoc)], capacity: u64) -> std::result::Result<Plan, u64> {
    let mut plan = Plan {
        moves: Vec::new(),
        relabels: Vec::new(),
        skipped: 0,
        end: Frontier::new(0, 0, capacity),
    };
    let mut i = 0;
    while i < live.len() {
        let old = live[i].1;
        let end = i + live[i..].iter().take_while(|(_, e)| same_bytes(e, &old)).count();
        let size = u64::from(old.phys_length);
        // Packing never needs more chunks than the records already use.
        let dest = plan.end.place(size).ok_or(live[i].0)?;
        let here = (u64::from(old.chunk_id), u64::from(old.offset));
        let indices = || live[i..end].iter().map(|(idx, _)| *idx).collect();
        if dest == here {
            plan.skipped += 1;
        } else if dest > here {
            return Err(live[i].0);
        } else if size == 0 {
            plan.relabels.push(Move { indices: indices(), old, dest });
        } else {
            plan.moves.push(Move { indices: indices(), old, dest });
        }
        i = end;
    }
    Ok(plan)
}

impl Store {
    /// Repacks the live records; see the module docs. Needs exclusive access. Validate, plan
    /// ([`plan`], pure), move the bytes, commit the new frontier.
    pub fn compact(&self) -> Result<CompactReport> {
        let _guard = self.activity.exclusive("compact")?;
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        let capacity = self.chunks.capacity();
        let len = self.len();
        let mut live: Vec<(u64, RecordLoc)> = (0..len).map(|i| (i, self.meta.entry(i))).collect();
        live.sort_by_key(|(_, e)| (e.chunk_id, e.offset, e.phys_length));
        self.check_layout(&live, (state.tail_chunk, state.tail_offset))?;

        let old_tail = (state.tail_chunk, state.tail_offset);
        let mut report = CompactReport {
            chunk_bytes_before: old_tail.0 * capacity + old_tail.1,
            ..Default::default()
        };
        let Plan { moves, relabels, skipped, end: packed } =
            plan(&live, capacity).map_err(|index| {
                Error::corrupt(
                    &self.meta_path,
                    format!("record {index} would move up during compaction"),
                )
            })?;
        report.skipped = skipped;
        report.moved = moves.len() as u64;
        self.epoch.require(&self.disk)?;
        self.check_staging_space(&moves)?;

        self.move_all(moves, old_tail, &mut state)?;
        // Empty records take their packed place before the frontier moves below their old one
        // (their new place is below both frontiers, so either header finds them in the data).
        self.repoint(&BTreeSet::new(), relabels.iter().map(|m| (m, m.dest)))?;
        report.chunks_removed = self.commit_packing(packed, old_tail, &mut state)?;
        report.chunk_bytes_after = packed.chunk * capacity + packed.offset;
        Ok(report)
    }

    /// Moves the records in batches of at most [`BATCH_BYTES`], each staged past the old
    /// frontier `old_tail` (staging space is reused by the next batch).
    fn move_all(
        &self,
        moves: Vec<Move>,
        old_tail: (u64, u64),
        state: &mut WriterState,
    ) -> Result<()> {
        let mut batch = Batch::default();
        let staging_start = Frontier::new(old_tail.0, old_tail.1, self.chunks.capacity());
        let mut stage = staging_start;
        for m in moves {
            let size = u64::from(m.old.phys_length);
            if !batch.moves.is_empty() && batch.bytes.len() as u64 + size > BATCH_BYTES {
                self.move_batch(&std::mem::take(&mut batch), state)?;
                stage = staging_start;
            }
            let place = stage.place(size).ok_or(Error::LimitExceeded {
                what: "chunk count (compaction staging)",
                limit: MAX_CHUNKS,
                requested: stage.chunk + 1,
            })?;
            // Read with pread, not through the map: pages a map has touched stay mapped, and
            // then they could not be dropped from the cache below.
            let chunk = self.chunks.get(u64::from(m.old.chunk_id))?;
            batch.hot.push(chunk.resident(u64::from(m.old.offset), size));
            let at = batch.bytes.len();
            batch.bytes.resize(at + size as usize, 0);
            chunk.read_into(u64::from(m.old.offset), &mut batch.bytes[at..])?;
            batch.moves.push((m, place));
        }
        if batch.moves.is_empty() {
            return Ok(());
        }
        self.move_batch(&batch, state)
    }

    /// Refuses to start when the filesystem lacks the space the staging area needs (the
    /// largest batch, at most [`BATCH_BYTES`]): compaction frees space only at its end, so on a
    /// disk the store has filled it would otherwise fail half-way with `ENOSPC`.
    fn check_staging_space(&self, moves: &[Move]) -> Result<()> {
        let moved: u64 = moves.iter().map(|m| u64::from(m.old.phys_length)).sum();
        let largest = moves.iter().map(|m| u64::from(m.old.phys_length)).max().unwrap_or(0);
        // A batch closes once the next record would take it past BATCH_BYTES.
        let need = moved.min(BATCH_BYTES.max(largest));
        if need == 0 {
            return Ok(());
        }
        let fs = rustix::fs::fstatvfs(&self.meta_file)
            .map_err(|e| Error::io(&self.dir, std::io::Error::from(e)))?;
        let free = fs.f_bavail.saturating_mul(fs.f_frsize);
        if free >= need {
            return Ok(());
        }
        let mib = |n: u64| n.div_ceil(1 << 20);
        Err(Error::io(
            &self.dir,
            std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "compaction stages the records it moves past the end of the data before it \
                     frees anything, and needs about {} MiB free for that; the filesystem has {} \
                     MiB free. Free some space (or copy the store to a disk with room, where the \
                     copy is compact already) and compact again; nothing was changed",
                    mib(need),
                    mib(free)
                ),
            ),
        ))
    }

    /// The commit: the header names the packed frontier (synced), then the space past it goes
    /// (chunk files past it removed, the rest of its chunk punched out). Returns the number of
    /// chunk files removed.
    fn commit_packing(
        &self,
        packed: Frontier,
        old_tail: (u64, u64),
        state: &mut WriterState,
    ) -> Result<u64> {
        self.failpoints.hit("compact:before-header").map_err(Error::internal)?;
        let (chunk, offset) = packed.at();
        (state.tail_chunk, state.tail_offset) = (chunk, offset);
        state.dirty_table = true;
        self.sync_locked(state)?;
        // Only now that the header names the new frontier may the space past it go, including
        // staging chunks left behind by an earlier, interrupted run. Readers elsewhere may still
        // hold entries that point there: they read again.
        self.epoch.bump_moves();
        let mut removed = 0;
        let mut id = chunk + 1;
        while id < MAX_CHUNKS
            && (id <= old_tail.0 + 1 || self.dir.join(chunk_file_name(id)).exists())
        {
            removed += u64::from(self.chunks.remove(id)?);
            id += 1;
        }
        // Holes, not truncation: a reader that maps the file must never find a page gone.
        if let Ok(c) = self.chunks.get(chunk) {
            c.punch_from(offset)?;
        }
        Ok(removed)
    }

    /// Moves one batch through staging; see the module docs for the order of steps.
    fn move_batch(&self, batch: &Batch, state: &mut WriterState) -> Result<()> {
        // Staging may reuse space an earlier batch's entries pointed at while it moved.
        self.epoch.bump_moves();
        let mut at = 0usize;
        let mut staged = BTreeSet::new();
        let mut stage_end = (state.tail_chunk, state.tail_offset);
        for (m, stage) in &batch.moves {
            let size = m.old.phys_length as usize;
            self.chunks.get_or_create(stage.0)?.write(stage.1, &batch.bytes[at..at + size])?;
            staged.insert(stage.0);
            stage_end = stage_end.max((stage.0, stage.1 + size as u64));
            at += size;
        }
        self.failpoints.hit("compact:staged").map_err(Error::internal)?;
        // The header's frontier moves past the staging area (with the staged bytes synced)
        // before any entry points there: a durable entry never lies past the durable frontier,
        // where appends would overwrite it.
        state.dirty_chunks.extend(&staged);
        if stage_end > (state.tail_chunk, state.tail_offset) {
            (state.tail_chunk, state.tail_offset) = stage_end;
        }
        self.sync_locked(state)?;
        self.repoint(&BTreeSet::new(), batch.moves.iter().map(|(m, s)| (m, *s)))?;
        // The final places overwrite bytes that readers elsewhere may still have entries for.
        self.epoch.bump_moves();
        let mut at = 0usize;
        let mut placed = BTreeSet::new();
        for (m, _) in &batch.moves {
            let size = m.old.phys_length as usize;
            self.chunks.get_or_create(m.dest.0)?.write(m.dest.1, &batch.bytes[at..at + size])?;
            placed.insert(m.dest.0);
            at += size;
            self.failpoints.hit("compact:move").map_err(Error::internal)?;
        }
        self.repoint(&placed, batch.moves.iter().map(|(m, _)| (m, m.dest)))?;
        self.drop_cold_copies(batch);
        Ok(())
    }

    /// Drops from the page cache the (synced) old, staged and new copies of the records no
    /// reader had cached, so that compacting a store larger than memory does not push readers'
    /// pages out. The kernel drops whole pages only: neighbouring ranges are merged into spans
    /// and each span is widened to whole pages.
    fn drop_cold_copies(&self, batch: &Batch) {
        let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
        for ((m, stage), hot) in batch.moves.iter().zip(&batch.hot) {
            if !hot {
                let size = u64::from(m.old.phys_length);
                let old = (u64::from(m.old.chunk_id), u64::from(m.old.offset));
                for (chunk, offset) in [old, m.dest, *stage] {
                    ranges.push((chunk, offset, offset + size));
                }
            }
        }
        for (chunk, start, end) in merge_spans(ranges.into_iter(), PAGE) {
            if let Ok(c) = self.chunks.get(chunk) {
                let from = start / PAGE * PAGE;
                c.drop_cache(from, end.div_ceil(PAGE) * PAGE - from);
            }
        }
    }

    /// Syncs the chunks just written, then points each move's entries at its new place and
    /// syncs the table.
    fn repoint<'m>(
        &self,
        written: &BTreeSet<u64>,
        places: impl Iterator<Item = (&'m Move, (u64, u64))>,
    ) -> Result<()> {
        for &id in written {
            self.chunks.get(id)?.sync()?;
        }
        let mut rebound = Vec::new();
        for (m, (chunk, offset)) in places {
            let loc = RecordLoc { chunk_id: chunk as u16, offset: offset as u32, ..m.old };
            for &idx in &m.indices {
                let before = self.meta.entry(idx);
                self.write_entries(idx, &[loc])?;
                rebound.push((idx, before, loc));
            }
        }
        self.sync_meta()?;
        // Checksums follow their records to the new place: the sum is of the logical bytes,
        // which do not change; only a binding that was valid is moved (a stale one stays stale).
        if let Some(sums) = self.sums.get() {
            for (idx, before, after) in rebound {
                let e = sums.entry(idx);
                if e.binding == binding(&before) {
                    sums.write(
                        &self.disk,
                        idx,
                        &[SumEntry { sum: e.sum, binding: binding(&after) }],
                    )?;
                }
            }
            sums.sync(&self.disk)?;
        }
        Ok(())
    }

    /// Refuses to compact a table whose records overlap (other than exact duplicates), lie past
    /// the frontier, or point outside their chunk files: moving them could destroy data.
    fn check_layout(&self, live: &[(u64, RecordLoc)], tail: (u64, u64)) -> Result<()> {
        let mut prev: Option<&(u64, RecordLoc)> = None;
        for item in live {
            let (idx, e) = item;
            if e.phys_length == 0 {
                continue;
            }
            let (chunk, offset, size) =
                (u64::from(e.chunk_id), u64::from(e.offset), u64::from(e.phys_length));
            self.chunks.get(chunk)?.read(offset, size)?;
            if chunk > tail.0 || (chunk == tail.0 && offset + size > tail.1) {
                return Err(Error::corrupt(
                    &self.meta_path,
                    format!("record {idx} lies past the append frontier {tail:?}"),
                ));
            }
            if let Some((pidx, p)) = prev {
                let overlaps = p.chunk_id == e.chunk_id
                    && offset < u64::from(p.offset) + u64::from(p.phys_length);
                if overlaps && !same_bytes(p, e) {
                    return Err(Error::corrupt(
                        &self.meta_path,
                        format!("records {pidx} and {idx} overlap in chunk {chunk}"),
                    ));
                }
            }
            prev = Some(item);
        }
        Ok(())
    }
}

fn same_bytes(a: &RecordLoc, b: &RecordLoc) -> bool {
    (a.chunk_id, a.offset, a.phys_length) == (b.chunk_id, b.offset, b.phys_length)
}

#[cfg(test)]
mod plan_tests {
    use super::plan;
    use crate::format::RecordLoc;

    fn at(index: u64, chunk: u16, offset: u32, len: u32) -> (u64, RecordLoc) {
        let loc = RecordLoc {
            offset,
            phys_length: len,
            logic_length: len,
            chunk_id: chunk,
            codec: 0,
            reserved: 0,
        };
        (index, loc)
    }

    #[test]
    fn packs_down_with_the_append_rule_and_skips_what_is_in_place() {
        // Chunks of 10 bytes: [0,4) stays; the 6 bytes at 6 move down to 4 and fill chunk 0
        // exactly, so chunk 1's record moves to chunk 1's start.
        let live = [at(0, 0, 0, 4), at(3, 0, 6, 6), at(1, 1, 5, 3), at(2, 2, 0, 0)];
        let p = plan(&live, 10).unwrap();
        let dests: Vec<(Vec<u64>, (u64, u64))> =
            p.moves.iter().map(|m| (m.indices.clone(), m.dest)).collect();
        assert_eq!(dests, [(vec![3], (0, 4)), (vec![1], (1, 0))]);
        assert_eq!(p.skipped, 1, "record 0 is in place");
        // The empty record would lie past the new frontier: its entry follows the packing.
        let relabels: Vec<(Vec<u64>, (u64, u64))> =
            p.relabels.iter().map(|m| (m.indices.clone(), m.dest)).collect();
        assert_eq!(relabels, [(vec![2], (1, 3))]);
        assert_eq!(p.end.at(), (1, 3));
    }

    #[test]
    fn entries_sharing_bytes_move_together() {
        let live = [at(5, 0, 8, 4), at(9, 0, 8, 4)];
        let p = plan(&live, 100).unwrap();
        assert_eq!(p.moves.len(), 1);
        assert_eq!((p.moves[0].indices.clone(), p.moves[0].dest), (vec![5, 9], (0, 0)));
        assert_eq!(p.end.at(), (0, 4));
    }

    #[test]
    fn overlapping_records_are_refused() {
        // Record 7 starts inside record 6's bytes: packing would move it up.
        let live = [at(6, 0, 0, 8), at(7, 0, 4, 8)];
        assert_eq!(plan(&live, 100).err(), Some(7));
    }
}
