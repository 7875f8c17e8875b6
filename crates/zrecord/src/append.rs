//! `append`: compress concurrently, plan the records' places from the frontier ([`plan`], pure),
//! write the data concurrently, then commit: the table entries, the checksums, the new length.
//!
//! A compressed append on several threads runs as a pipeline (`pipeline.rs`): segments are
//! compressed, placed in order and written as each is ready. Everything else -- a raw append,
//! one thread, or an append whose raw sizes would not fit the chunk limit -- compresses every
//! segment first (in parallel blocks, outside the writer mutex), then places and writes. A raw
//! append of records all of one size (a fixed-width column) without checksums that fits the
//! current chunk is placed as one run ([`plan_fixed`]: the entries are arithmetic, one write),
//! in the places the record-by-record [`plan`] would give it.
//!
//! Everything that can be refused (sizes, limits, codec, writer lock) is checked before the
//! first byte is written. Data lands in the chunk files before its table entries, and the
//! entries before the length, so a failure at any step leaves the published store unchanged and
//! the frontier where it was (the space is reused by the next append).

use std::collections::BTreeSet;

use crate::codec::Encoder;
use crate::error::{Error, Result};
use crate::format::{Codec, RecordLoc, SumEntry, MAX_CHUNKS, MAX_RECORDS, MAX_RECORD_BYTES};
use crate::frontier::Frontier;
use crate::pool::{num_threads, run_balanced, run_sharded};
use crate::profile::{timed, Stage};
use crate::segments::{self, Buf, Pending, Segment};
use crate::store::{Store, WriterState};
use crate::sums::binding;

/// A run of stored bytes to write at one place in one chunk.
pub(crate) struct Write {
    pub chunk: u64,
    pub offset: u64,
    pub buf: Buf,
    pub range: (usize, usize),
}

impl Store {
    /// Appends the records packed in `src`: record `i` is `src[offsets[i]..offsets[i + 1]]`, the
    /// last one runs to the end of `src`. Returns the index of the first new record.
    pub fn append(&self, src: &[u8], offsets: &[u64], codec: Option<Codec>) -> Result<u64> {
        timed(Stage::Append, || self.append_unprofiled(src, offsets, codec))
    }

    fn append_unprofiled(&self, src: &[u8], offsets: &[u64], codec: Option<Codec>) -> Result<u64> {
        let codec = codec.unwrap_or(self.default_codec);
        let _guard = self.activity.shared("append")?;
        if codec == Codec::Raw && !self.has_checksums() {
            // Records of one size (a fixed-width column): checked and placed as one run.
            if let Some((start, size)) = fixed_size(src.len(), offsets) {
                if let Some(first) = self.append_fixed(src, start, size, offsets.len() as u64)? {
                    return Ok(first);
                }
            }
        }
        let ranges = record_ranges(src.len(), offsets)?;
        if ranges.is_empty() {
            return Ok(self.len());
        }
        if codec == Codec::ZstdDict && !self.has_dict() {
            return Err(Error::MissingDictionary { path: self.dir.clone() });
        }
        let threads = num_threads();
        let segs = segments::split(&ranges, threads);
        {
            // Learn about a refused writer lock before spending time compressing.
            let mut state = self.lock_writer()?;
            self.ensure_writer(&mut state)?;
            if self.len() + ranges.len() as u64 > MAX_RECORDS {
                return Err(record_limit(self.len() + ranges.len() as u64));
            }
            if codec != Codec::Raw
                && threads > 1
                && segs.len() > 1
                && fits_raw(&state, self, &ranges)
            {
                return self.append_pipelined(src, &ranges, &segs, codec, &mut state);
            }
        }
        let segments = self.encode(src, &ranges, &segs, codec)?;
        let result = self.place_and_write(src, &ranges, &segments);
        for seg in segments {
            self.out_bufs.give(seg.out);
        }
        result
    }

    /// A raw append of `n` records of `size` bytes each, back to back in `src` from `start`,
    /// without checksums: placed, written and committed as one run when it fits the current
    /// chunk (`None` otherwise, nothing done: the general path then places it record by record).
    fn append_fixed(&self, src: &[u8], start: usize, size: u64, n: u64) -> Result<Option<u64>> {
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        if self.has_checksums() {
            return Ok(None); // enabled by another handle since the caller looked
        }
        let first = self.len();
        if first + n > MAX_RECORDS {
            return Err(record_limit(first + n));
        }
        let mut frontier =
            Frontier::new(state.tail_chunk, state.tail_offset, self.chunks.capacity());
        let Some((entries, write)) =
            timed(Stage::Plan, || plan_fixed(&mut frontier, n, size, (start, src.len())))
        else {
            return Ok(None);
        };
        self.failpoints.hit("append:before-data").map_err(Error::internal)?;
        let bytes_of = |_: Buf, (a, b): (usize, usize)| -> &[u8] { &src[a..b] };
        let mut writes = [write];
        self.write_data(&state, &mut writes, &bytes_of)?;
        state.dirty_chunks.insert(writes[0].chunk);
        self.commit(&mut state, first, &entries, None, frontier).map(Some)
    }

    /// The serial path's second half: places every record, writes the runs, commits.
    fn place_and_write(
        &self,
        src: &[u8],
        ranges: &[(usize, usize)],
        segments: &[Segment],
    ) -> Result<u64> {
        let mut records = Vec::with_capacity(ranges.len());
        for (s, seg) in segments.iter().enumerate() {
            records.extend(seg.pending.iter().map(|p| Pending {
                buf: if p.buf == Buf::Caller { Buf::Caller } else { Buf::Shard(s) },
                ..*p
            }));
        }
        let bytes_of = |buf: Buf, (a, b): (usize, usize)| -> &[u8] {
            match buf {
                Buf::Caller => &src[a..b],
                Buf::Shard(s) => &segments[s].out[a..b],
            }
        };

        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        let first = self.len();
        let n = records.len() as u64;
        if first + n > MAX_RECORDS {
            return Err(record_limit(first + n));
        }
        let mut frontier =
            Frontier::new(state.tail_chunk, state.tail_offset, self.chunks.capacity());
        let (entries, mut writes) = timed(Stage::Plan, || plan(&records, &mut frontier))?;
        self.failpoints.hit("append:before-data").map_err(Error::internal)?;
        self.write_data(&state, &mut writes, &bytes_of)?;
        state.dirty_chunks.extend(writes.iter().map(|w| w.chunk));
        let sums: Option<Vec<SumEntry>> = self.sums.get().map(|_| {
            let mut all = Vec::with_capacity(records.len());
            for seg in segments {
                all.extend_from_slice(&seg.sums);
            }
            all.iter()
                .zip(&entries)
                .map(|(&sum, loc)| SumEntry { sum, binding: binding(loc) })
                .collect()
        });
        self.commit(&mut state, first, &entries, sums.as_deref(), frontier)
    }

    /// Commits an append whose data is written: the table entries, the checksums, then the
    /// new frontier and length.
    pub(crate) fn commit(
        &self,
        state: &mut WriterState,
        first: u64,
        entries: &[RecordLoc],
        sums: Option<&[SumEntry]>,
        frontier: Frontier,
    ) -> Result<u64> {
        self.failpoints.hit("append:before-table").map_err(Error::internal)?;
        self.write_entries(first, entries)?;
        state.dirty_table = true;
        if let (Some(file), Some(sums)) = (self.sums.get(), sums) {
            file.write(&self.disk, first, sums)?;
            state.dirty_sums = true;
        }
        self.failpoints.hit("append:before-publish").map_err(Error::internal)?;
        (state.tail_chunk, state.tail_offset) = frontier.at();
        self.len.publish((first + entries.len() as u64) as u32);
        Ok(first)
    }

    /// Writes the planned runs into their chunk files (in parallel), after checking that the
    /// chunk holding the old frontier still reaches it and creating the chunks that are new.
    fn write_data<'b>(
        &self,
        state: &WriterState,
        writes: &mut [Write],
        bytes_of: &(dyn Fn(Buf, (usize, usize)) -> &'b [u8] + Sync),
    ) -> Result<()> {
        let touched: BTreeSet<u64> = writes.iter().map(|w| w.chunk).collect();
        for &id in &touched {
            self.prepare_chunk(state.tail_chunk, state.tail_offset, id)?;
        }
        let total: usize = writes.iter().map(|w| w.range.1 - w.range.0).sum();
        run_sharded(writes, total, |block: &mut [Write]| -> Result<()> {
            for w in block.iter() {
                self.chunks.get(w.chunk)?.write(w.offset, bytes_of(w.buf, w.range))?;
            }
            Ok(())
        })
    }

    /// Makes chunk `id` ready for writing: the chunk holding the frontier `(tail_chunk,
    /// tail_offset)` must exist and reach it (appending to a recreated or truncated file would
    /// make the records before the frontier read as zeros); a chunk past it is created.
    pub(crate) fn prepare_chunk(&self, tail_chunk: u64, tail_offset: u64, id: u64) -> Result<()> {
        if id == tail_chunk && tail_offset > 0 {
            let chunk = self.chunks.get(id)?;
            let size = chunk.file_size()?;
            if size < tail_offset {
                return Err(Error::corrupt(
                    self.chunks.path(id),
                    format!(
                        "chunk file is {size} bytes but the store's data reaches byte \
                         {tail_offset}"
                    ),
                ));
            }
        } else {
            self.chunks.get_or_create(id)?;
        }
        Ok(())
    }

    /// Sums and compresses every segment, in parallel blocks, each into its own output buffer.
    /// Records that do not shrink (and every record of a raw append) stay in the caller's
    /// buffer.
    fn encode(
        &self,
        src: &[u8],
        ranges: &[(usize, usize)],
        segs: &[std::ops::Range<usize>],
        codec: Codec,
    ) -> Result<Vec<Segment>> {
        let with_sums = self.has_checksums();
        let mut slots: Vec<(std::ops::Range<usize>, Option<Segment>)> =
            segs.iter().map(|r| (r.clone(), None)).collect();
        if codec == Codec::Raw && !with_sums {
            return Ok(slots
                .into_iter()
                .map(|(records, _)| Segment {
                    pending: ranges[records.clone()]
                        .iter()
                        .map(|&r| Pending {
                            src: r,
                            codec: Codec::Raw,
                            buf: Buf::Caller,
                            stored: r,
                        })
                        .collect(),
                    out: Vec::new(),
                    sums: Vec::new(),
                })
                .collect());
        }
        let dict = self.dictionary();
        // Compression is the costly part, so the block count is driven by a generous estimate.
        run_balanced(&mut slots, src.len() * 8, |block| -> Result<()> {
            let mut encoder = Encoder::new(dict, with_sums);
            for (records, seg) in block.iter_mut() {
                *seg = Some(segments::compress(
                    &mut encoder,
                    src,
                    ranges,
                    records.clone(),
                    codec,
                    with_sums,
                    &self.out_bufs,
                )?);
            }
            Ok(())
        })?;
        slots
            .into_iter()
            .map(|(_, seg)| seg.ok_or_else(|| Error::internal("a segment was not compressed")))
            .collect()
    }
}

/// Whether the records, at their raw sizes, fit behind the frontier within the chunk limit:
/// then their compressed sizes do too (bytes no longer than others never end further), and a
/// pipeline that writes before it knows every size cannot run into the limit half-way.
fn fits_raw(state: &WriterState, store: &Store, ranges: &[(usize, usize)]) -> bool {
    let mut frontier = Frontier::new(state.tail_chunk, state.tail_offset, store.chunks.capacity());
    ranges.iter().all(|&(a, b)| frontier.place((b - a) as u64).is_some())
}

/// The plan of an append (pure): each record's table entry and the runs of bytes to write,
/// placed from `frontier` (which ends past the last record).
pub(crate) fn plan(
    records: &[Pending],
    frontier: &mut Frontier,
) -> Result<(Vec<RecordLoc>, Vec<Write>)> {
    let mut entries = Vec::with_capacity(records.len());
    let mut writes: Vec<Write> = Vec::new();
    for r in records {
        let len = (r.stored.1 - r.stored.0) as u64;
        let (chunk, offset) = frontier.place(len).ok_or(Error::LimitExceeded {
            what: "chunk count",
            limit: MAX_CHUNKS,
            requested: frontier.chunk + 1,
        })?;
        entries.push(RecordLoc {
            offset: offset as u32,
            phys_length: len as u32,
            logic_length: (r.src.1 - r.src.0) as u32,
            // An empty record past the last chunk names the last one (it reads no bytes).
            chunk_id: chunk.min(MAX_CHUNKS - 1) as u16,
            codec: r.codec as u8,
            reserved: 0,
        });
        push_write(&mut writes, Write { chunk, offset, buf: r.buf, range: r.stored });
    }
    Ok((entries, writes))
}

/// The plan of `n` raw records of `size` bytes each, stored as the caller's bytes `range` (pure):
/// their table entries, arithmetic, and the one write, when the whole run fits the frontier's
/// chunk (`None` otherwise). The same places as [`plan`] gives them one by one.
pub(crate) fn plan_fixed(
    frontier: &mut Frontier,
    n: u64,
    size: u64,
    range: (usize, usize),
) -> Option<(Vec<RecordLoc>, Write)> {
    let (chunk, offset) = frontier.place_run(n.checked_mul(size)?)?;
    let entries = (0..n)
        .map(|i| RecordLoc {
            offset: (offset + i * size) as u32,
            phys_length: size as u32,
            logic_length: size as u32,
            chunk_id: chunk as u16,
            codec: Codec::Raw as u8,
            reserved: 0,
        })
        .collect();
    Some((entries, Write { chunk, offset, buf: Buf::Caller, range }))
}

/// `(first byte, size)` when the records of `offsets` in a buffer of `len` bytes all have one
/// size, above zero and within the record limit (the records of a fixed-width column).
fn fixed_size(len: usize, offsets: &[u64]) -> Option<(usize, u64)> {
    let (&first, &last) = (offsets.first()?, offsets.last()?);
    let size = (len as u64).checked_sub(last)?;
    if size == 0 || size > MAX_RECORD_BYTES {
        return None;
    }
    let mut expect = first;
    for &o in offsets {
        if o != expect {
            return None;
        }
        expect = expect.checked_add(size)?;
    }
    Some((first as usize, size))
}

fn record_limit(requested: u64) -> Error {
    Error::LimitExceeded { what: "record count", limit: MAX_RECORDS, requested }
}

/// Adds a write, merging it into the previous one when both the chunk range and the source
/// bytes continue it (the usual case: a raw batch, or one shard's output, within one chunk).
fn push_write(writes: &mut Vec<Write>, w: Write) {
    if w.range.0 == w.range.1 {
        return;
    }
    if let Some(last) = writes.last_mut() {
        let len = (last.range.1 - last.range.0) as u64;
        if last.chunk == w.chunk
            && last.offset + len == w.offset
            && last.buf == w.buf
            && last.range.1 == w.range.0
        {
            last.range.1 = w.range.1;
            return;
        }
    }
    writes.push(w);
}

/// Checks `offsets` against a buffer of `len` bytes and turns them into byte ranges.
fn record_ranges(len: usize, offsets: &[u64]) -> Result<Vec<(usize, usize)>> {
    let mut ranges = Vec::with_capacity(offsets.len());
    for (i, &start) in offsets.iter().enumerate() {
        let end = offsets.get(i + 1).copied().unwrap_or(len as u64);
        if start > end || end > len as u64 {
            return Err(Error::invalid(format!(
                "offsets must be non-decreasing and within the {len}-byte source: record {i} \
                 would span {start}..{end}"
            )));
        }
        let size = end - start;
        if size > MAX_RECORD_BYTES {
            return Err(Error::LimitExceeded {
                what: "record size (bytes)",
                limit: MAX_RECORD_BYTES,
                requested: size,
            });
        }
        ranges.push((start as usize, end as usize));
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::{fixed_size, plan, plan_fixed, Buf, Pending};
    use crate::error::Error;
    use crate::format::{Codec, MAX_CHUNKS};
    use crate::frontier::Frontier;

    /// Raw records of the given lengths, back to back in the caller's buffer.
    fn raw(lengths: &[usize]) -> Vec<Pending> {
        let mut at = 0;
        lengths
            .iter()
            .map(|&n| {
                at += n;
                let r = (at - n, at);
                Pending { src: r, codec: Codec::Raw, buf: Buf::Caller, stored: r }
            })
            .collect()
    }

    #[test]
    fn places_records_and_merges_contiguous_writes() {
        let mut frontier = Frontier::new(0, 2, 10);
        let (entries, writes) = plan(&raw(&[3, 5, 4, 0, 6]), &mut frontier).unwrap();
        let places: Vec<(u16, u32, u32)> =
            entries.iter().map(|e| (e.chunk_id, e.offset, e.phys_length)).collect();
        assert_eq!(places, [(0, 2, 3), (0, 5, 5), (1, 0, 4), (1, 4, 0), (1, 4, 6)]);
        assert_eq!(frontier.at(), (2, 0));
        // One write per chunk: the records are contiguous in the caller's buffer and on disk.
        let runs: Vec<(u64, u64, (usize, usize))> =
            writes.iter().map(|w| (w.chunk, w.offset, w.range)).collect();
        assert_eq!(runs, [(0, 2, (0, 8)), (1, 0, (8, 18))]);
    }

    /// The one-step plan of a run of same-size raw records against [`plan`] placing them one
    /// by one: the same entries, the same single write and frontier when the run fits the
    /// chunk; no plan (the caller falls back) when it would cross a chunk end or the last one.
    #[test]
    fn a_fixed_size_run_is_placed_as_one_by_one() {
        let mut state = 99u64;
        let mut next = |below: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % below
        };
        let (mut fitted, mut refused) = (0, 0);
        for _ in 0..3000 {
            let capacity = 1 + next(200);
            let size = 1 + next(capacity);
            let start = next(capacity);
            // Up to a little more than the rest of the chunk holds.
            let n = 1 + next((capacity - start) / size + 2);
            let chunk = if next(8) == 0 { MAX_CHUNKS - 1 + next(2) } else { next(3) };
            let skip = next(5) as usize; // bytes of the caller's buffer before the first record
            let lengths = vec![size as usize; n as usize];
            let mut records = raw(&lengths);
            for r in &mut records {
                r.src = (r.src.0 + skip, r.src.1 + skip);
                r.stored = r.src;
            }
            let range = (skip, skip + (n * size) as usize);
            let mut one = Frontier::new(chunk, start, capacity);
            let mut each = Frontier::new(chunk, start, capacity);
            let fits = start + n * size <= capacity && chunk < MAX_CHUNKS;
            if let Some((entries, write)) = plan_fixed(&mut one, n, size, range) {
                assert!(fits);
                fitted += 1;
                let (want, writes) = plan(&records, &mut each).unwrap();
                assert_eq!(bytemuck::cast_slice::<_, u8>(&entries), bytemuck::cast_slice(&want));
                assert_eq!(writes.len(), 1);
                let w = &writes[0];
                assert_eq!((write.chunk, write.offset, write.range), (w.chunk, w.offset, w.range));
                assert_eq!(one.at(), each.at());
            } else {
                assert!(!fits, "a run that fits was refused");
                refused += 1;
                assert_eq!(one.at(), (chunk, start), "a refused run moved the frontier");
            }
        }
        assert!(fitted > 500 && refused > 500, "{fitted} fitted, {refused} refused");
    }

    #[test]
    fn fixed_sizes_are_recognised_exactly() {
        assert_eq!(fixed_size(24, &[0, 8, 16]), Some((0, 8)));
        assert_eq!(fixed_size(27, &[3, 11, 19]), Some((3, 8)));
        assert_eq!(fixed_size(24, &[0, 8, 17]), None, "the last record is shorter");
        assert_eq!(fixed_size(24, &[0, 9, 16]), None);
        assert_eq!(fixed_size(8, &[8]), None, "empty records go the general way");
        assert_eq!(fixed_size(8, &[9]), None, "past the end");
        assert_eq!(fixed_size(8, &[]), None);
        assert_eq!(fixed_size(8, &[u64::MAX - 2, 0]), None);
        assert_eq!(fixed_size(2 << 20, &[0, 1 << 20]), Some((0, 1 << 20)));
        assert_eq!(fixed_size((2 << 20) + 2, &[0, (1 << 20) + 1]), None, "over the limit");
    }

    #[test]
    fn past_the_last_chunk_is_refused_before_anything_is_written() {
        let mut frontier = Frontier::new(MAX_CHUNKS - 1, 6, 10);
        let e = plan(&raw(&[4, 1]), &mut frontier).err().unwrap();
        assert!(matches!(e, Error::LimitExceeded { what: "chunk count", .. }), "{e}");
    }
}
