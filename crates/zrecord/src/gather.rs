//! `gather` and `lengths`: the read path. Lock-free: it loads the length once, reads table
//! entries by value and copies or decompresses each record straight into its slice of the
//! caller's destination, sharded across the pool in contiguous blocks. Each call runs inside
//! `Store::consistent_read`, which refuses a view another handle's delete invalidated and reads
//! again when another process's compaction moved bytes during the call.

use crate::chunks::Chunk;
use crate::codec::{copy_bytes, Decoder};
use crate::error::{Error, Result};
use crate::format::{Codec, RecordLoc, MAX_RECORD_BYTES};
use crate::pool::run_sharded_at_most;
use crate::store::Store;
use crate::sums::{Sums, Verdict};

/// One record to read: its index, its table entry and where it goes.
pub(crate) struct Slot<'d> {
    pub(crate) index: u64,
    pub(crate) loc: RecordLoc,
    pub(crate) dst: &'d mut [u8],
}

impl Store {
    /// Reads record `indices[i]` into `dst[dst_offsets[i]..][..its length]` for every `i`.
    /// Destination ranges must lie inside `dst` and must not overlap; a refused call writes
    /// nothing. On a corrupt record the error names it; other records may have been written.
    pub fn gather(&self, indices: &[u64], dst: &mut [u8], dst_offsets: &[u64]) -> Result<()> {
        let _guard = self.activity.shared("gather")?;
        if indices.len() != dst_offsets.len() {
            return Err(Error::invalid(format!(
                "{} indices but {} destination offsets",
                indices.len(),
                dst_offsets.len()
            )));
        }
        self.consistent_read(|| {
            let locs = self.entries(indices)?;
            let mut slots =
                split_destination(&self.meta_path, &mut *dst, indices, &locs, dst_offsets)?;
            self.read_slots(&mut slots, usize::MAX)
        })
    }

    /// Reads record `indices[i]` into `dst[i * record_len..][..record_len]`: the fixed-stride
    /// gather of a dense dataset. `dst` must hold exactly `indices.len() * record_len` bytes and
    /// every record must be exactly `record_len` bytes long (a record of another length is a
    /// store that does not match its schema, reported as corrupt before anything is written).
    /// The batch is split into at most `max_shards` parallel blocks (`usize::MAX`: one per pool
    /// thread; 1: on the calling thread).
    pub fn gather_fixed(
        &self,
        indices: &[u64],
        dst: &mut [u8],
        record_len: usize,
        max_shards: usize,
    ) -> Result<()> {
        self.gather_fixed_at(indices, None, dst, record_len, max_shards)
    }

    /// [`Store::gather_fixed`] into chosen rows: record `indices[i]` goes to row `rows[i]` of
    /// `dst` (rows of `record_len` bytes; `rows` strictly increasing, inside `dst`), other rows
    /// are left alone. A batch that spans several stores is gathered this way, one store's
    /// records at a time, straight into the one batch array. `rows: None` is `0, 1, 2, ...`.
    pub fn gather_fixed_at(
        &self,
        indices: &[u64],
        rows: Option<&[u64]>,
        dst: &mut [u8],
        record_len: usize,
        max_shards: usize,
    ) -> Result<()> {
        let _guard = self.activity.shared("gather")?;
        let dst_rows = check_rows(indices.len(), rows, dst.len(), record_len)?;
        self.consistent_read(|| {
            self.check_indices(indices)?;
            if record_len == 0 {
                // Nothing to copy: each entry is read for its length alone.
                return match indices.iter().find(|&&i| self.meta.entry(i).logic_length != 0) {
                    Some(&index) => Err(self.wrong_length(index, &self.meta.entry(index), 0)),
                    None => Ok(()),
                };
            }
            // The table entries go straight into the slots (no vector of their own); every
            // length is checked before any byte is written.
            let records = indices.iter().map(|&index| (index, self.meta.entry(index)));
            let mut slots: Vec<Slot<'_>> = match rows {
                // Every row in order (a dataset's own batch): no row filter to run per record.
                None => dst
                    .chunks_exact_mut(record_len)
                    .zip(records)
                    .map(|(dst, (index, loc))| Slot { index, loc, dst })
                    .collect(),
                // Rows strictly increasing (check_rows): each slot is split off the rest of
                // `dst` at its row, so the cost follows the records, not the destination's
                // size (a store of a concatenation fills a few of a batch's rows).
                Some(rows) => {
                    let mut rest: &mut [u8] = dst;
                    let mut at = 0usize;
                    let mut slots = Vec::with_capacity(rows.len());
                    for (&row, (index, loc)) in rows.iter().zip(records) {
                        let skip = (row as usize - at) * record_len;
                        let (slot, tail) =
                            std::mem::take(&mut rest)[skip..].split_at_mut(record_len);
                        rest = tail;
                        at = row as usize + 1;
                        slots.push(Slot { index, loc, dst: slot });
                    }
                    slots
                }
            };
            if let Some(s) = slots.iter().find(|s| s.loc.logic_length as usize != record_len) {
                return Err(self.wrong_length(s.index, &s.loc, record_len));
            }
            debug_assert_eq!(slots.len(), dst_rows);
            self.read_slots(&mut slots, max_shards)
        })
    }

    fn wrong_length(&self, index: u64, loc: &RecordLoc, record_len: usize) -> Error {
        Error::corrupt(
            &self.meta_path,
            format!(
                "record {index} holds {} bytes where every record of this dataset holds \
                 {record_len}",
                loc.logic_length
            ),
        )
    }

    /// Fills every slot: copied from the chunk maps, sharded across the pool, when the records
    /// are in memory; read with many `pread`s in flight when they are not (`cold.rs`).
    fn read_slots(&self, slots: &mut [Slot<'_>], max_shards: usize) -> Result<()> {
        if self.probably_cold(slots) {
            return self.read_slots_cold(slots);
        }
        let total: usize = slots.iter().map(|s| s.dst.len()).sum();
        let dict = self.dictionary();
        // Checked reads are decided once per call, not per record.
        let sums = self.checked_reads();
        run_sharded_at_most(slots, total, max_shards, |block: &mut [Slot<'_>]| -> Result<()> {
            let mut decoder = Decoder::new(dict);
            let mut last: Option<(u16, &Chunk)> = None;
            for s in block.iter_mut() {
                // Small raw records are common (labels, embeddings, token rows): for them the
                // fixed cost per record is most of the read, so they skip the general path's
                // codec dispatch and repeated chunk lookups. Checked reads take the general one.
                if sums.is_none()
                    && s.loc.codec == Codec::Raw as u8
                    && s.loc.phys_length == s.loc.logic_length
                    && s.loc.phys_length as usize == s.dst.len()
                    && !s.dst.is_empty()
                {
                    let chunk = match last {
                        Some((id, chunk)) if id == s.loc.chunk_id => chunk,
                        _ => {
                            let Some((_, chunk)) = self.locate(s.index, &s.loc)? else {
                                continue;
                            };
                            last = Some((s.loc.chunk_id, chunk));
                            chunk
                        }
                    };
                    let stored = chunk
                        .read(u64::from(s.loc.offset), u64::from(s.loc.phys_length))
                        .map_err(|e| for_record(e, s.index))?;
                    copy_bytes(s.dst, stored);
                    continue;
                }
                self.read_record(s.index, &s.loc, s.dst, &mut decoder)?;
                self.check_sum(sums, s)?;
            }
            Ok(())
        })
    }

    /// The checksums every read of this call is checked against, if reads are checked.
    pub(crate) fn checked_reads(&self) -> Option<&Sums> {
        self.sums.get().filter(|_| self.verify_reads())
    }

    /// Checks a record just read against its checksum, when reads are checked.
    pub(crate) fn check_sum(&self, sums: Option<&Sums>, s: &Slot<'_>) -> Result<()> {
        match sums {
            Some(sums) if sums.check(s.index, &s.loc, s.dst) == Verdict::Bad => {
                Err(Error::checksum_mismatch(self.chunks.path(u64::from(s.loc.chunk_id)), s.index))
            }
            _ => Ok(()),
        }
    }

    /// Logical length of each record.
    pub fn lengths(&self, indices: &[u64]) -> Result<Vec<u32>> {
        let _guard = self.activity.shared("lengths")?;
        self.consistent_read(|| Ok(self.entries(indices)?.iter().map(|l| l.logic_length).collect()))
    }

    /// The table entry of every index, read against one load of the published length.
    fn entries(&self, indices: &[u64]) -> Result<Vec<RecordLoc>> {
        self.check_indices(indices)?;
        // Checked first so that this loop has no early exit: the table reads (mostly cache
        // misses) then issue back to back into a vector of known size.
        Ok(indices.iter().map(|&index| self.meta.entry(index)).collect())
    }

    /// Refuses the first index at or past one load of the published length.
    fn check_indices(&self, indices: &[u64]) -> Result<()> {
        let len = self.len();
        match indices.iter().find(|&&index| index >= len) {
            Some(&index) => Err(Error::IndexOutOfRange { index, len }),
            None => Ok(()),
        }
    }

    /// Copies or decodes one record into `dst`, checking its entry against the store first.
    pub(crate) fn read_record(
        &self,
        index: u64,
        loc: &RecordLoc,
        dst: &mut [u8],
        dec: &mut Decoder,
    ) -> Result<()> {
        let Some((codec, chunk)) = self.locate(index, loc)? else { return Ok(()) };
        let stored = chunk
            .read(u64::from(loc.offset), u64::from(loc.phys_length))
            .map_err(|e| for_record(e, index))?;
        self.decode(index, loc, codec, stored, dst, dec)
    }

    /// The codec and chunk of a record, checked; `None` for an empty record (nothing to read).
    pub(crate) fn locate(&self, index: u64, loc: &RecordLoc) -> Result<Option<(Codec, &Chunk)>> {
        let codec = Codec::from_tag(loc.codec).ok_or_else(|| {
            Error::corrupt(
                &self.meta_path,
                format!("record {index} has unknown codec tag {}", loc.codec),
            )
        })?;
        if loc.phys_length == 0 && loc.logic_length == 0 {
            return Ok(None);
        }
        let chunk = self.chunks.get(u64::from(loc.chunk_id)).map_err(|e| match e {
            Error::Corrupt { path, detail } => {
                Error::corrupt(path, format!("{detail} (needed by record {index})"))
            }
            other => other,
        })?;
        Ok(Some((codec, chunk)))
    }

    /// Decodes a record's stored bytes into `dst`, which must come out exactly full.
    pub(crate) fn decode(
        &self,
        index: u64,
        loc: &RecordLoc,
        codec: Codec,
        stored: &[u8],
        dst: &mut [u8],
        dec: &mut Decoder,
    ) -> Result<()> {
        match dec.decode(codec, stored, dst) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::MissingDictionary { path: self.dir.clone() }),
            Err(e) => Err(Error::corrupt(
                self.chunks.path(u64::from(loc.chunk_id)),
                format!("record {index}: {e}"),
            )),
        }
    }
}

/// Names the record in a corruption error about its stored bytes.
pub(crate) fn for_record(e: Error, index: u64) -> Error {
    match e {
        Error::Corrupt { path, detail } => {
            Error::corrupt(path, format!("record {index}: {detail}"))
        }
        other => other,
    }
}

/// Checks a fixed-stride destination: without `rows`, exactly one `record_len` row per index;
/// with them, one strictly increasing row per index inside `dst`. Returns the rows to fill.
fn check_rows(
    count: usize,
    rows: Option<&[u64]>,
    dst_len: usize,
    record_len: usize,
) -> Result<usize> {
    let Some(rows) = rows else {
        let want = count.checked_mul(record_len);
        if want != Some(dst_len) {
            return Err(Error::invalid(format!(
                "destination holds {dst_len} bytes, {count} records of {record_len} bytes need {}",
                want.map_or_else(|| "more than fits in memory".to_string(), |n| n.to_string())
            )));
        }
        return Ok(count);
    };
    let dst_rows = dst_len.checked_div(record_len).map_or(u64::MAX, |n| n as u64);
    if rows.len() != count {
        return Err(Error::invalid(format!("{count} indices but {} destination rows", rows.len())));
    }
    if !dst_len.is_multiple_of(record_len) {
        return Err(Error::invalid(format!(
            "destination holds {dst_len} bytes, not a whole number of {record_len}-byte rows"
        )));
    }
    let increasing = rows.windows(2).all(|w| matches!(w, [a, b] if a < b));
    if !increasing || rows.last().is_some_and(|&r| r >= dst_rows) {
        return Err(Error::invalid(format!(
            "destination rows must be strictly increasing and below {dst_rows}"
        )));
    }
    Ok(count)
}

/// Cuts `dst` into one disjoint mutable slice per record, refusing ranges that overflow `dst` or
/// overlap each other. Sorting the ranges by start makes disjointness a check on neighbours and
/// lets plain `split_at_mut` hand out the slices, with no unsafe code.
fn split_destination<'d>(
    meta_path: &std::path::Path,
    dst: &'d mut [u8],
    indices: &[u64],
    locs: &[RecordLoc],
    offsets: &[u64],
) -> Result<Vec<Slot<'d>>> {
    let dst_len = dst.len() as u64;
    for (i, loc) in locs.iter().enumerate() {
        let size = u64::from(loc.logic_length);
        if size > MAX_RECORD_BYTES {
            return Err(Error::corrupt(
                meta_path,
                format!("record {} claims {size} bytes, over the 1 MiB limit", indices[i]),
            ));
        }
        let end = offsets[i].saturating_add(size);
        if end > dst_len {
            return Err(Error::invalid(format!(
                "destination too small: record {} needs bytes {}..{end} but the destination \
                 has {dst_len}",
                indices[i], offsets[i]
            )));
        }
    }
    let mut order: Vec<usize> = (0..locs.len()).collect();
    if !offsets.windows(2).all(|w| w[0] <= w[1]) {
        order.sort_by_key(|&i| offsets[i]);
    }
    let mut pieces: Vec<Option<&'d mut [u8]>> = (0..locs.len()).map(|_| None).collect();
    let mut rest = dst;
    let mut consumed = 0u64;
    let mut prev_end: Option<(usize, u64)> = None;
    for &i in &order {
        let (start, size) = (offsets[i], u64::from(locs[i].logic_length));
        if size == 0 {
            pieces[i] = Some(Default::default());
            continue;
        }
        if let Some((j, end)) = prev_end {
            if start < end {
                return Err(Error::invalid(format!(
                    "destination ranges overlap: record {} at {start} starts inside record {} \
                     (ends at {end})",
                    indices[i], indices[j]
                )));
            }
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - consumed) as usize);
        let (mine, after) = tail.split_at_mut(size as usize);
        pieces[i] = Some(mine);
        rest = after;
        consumed = start + size;
        prev_end = Some((i, start + size));
    }
    Ok(pieces
        .into_iter()
        .zip(indices.iter().zip(locs))
        .map(|(p, (&index, &loc))| Slot { index, loc, dst: p.unwrap_or_default() })
        .collect())
}
