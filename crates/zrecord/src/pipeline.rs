//! The pipelined compressed append: every worker takes the next segment from a shared counter,
//! compresses it, and hands it to the sequencer, which places segments strictly in order, each
//! as soon as all before it are placed; the worker that placed a segment writes it. So
//! compressing, placing and writing overlap with no barrier between them, and a segment's
//! frames are written while they are still in cache.
//!
//! Places depend on the frontier, so the pipeline runs under the writer mutex from start to
//! commit. It writes before it knows every record's size, so the caller first checks that the
//! records fit at their raw sizes (`append.rs`, `fits_raw`). A failure anywhere stops the
//! workers at their next segment; nothing is committed and the frontier stays where it was
//! (the bytes written past it are reused by the next append).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::append::{plan, Write};
use crate::codec::Encoder;
use crate::error::{Error, Result};
use crate::format::{Codec, RecordLoc, SumEntry};
use crate::frontier::Frontier;
use crate::pool::{num_threads, run_workers};
use crate::profile::{timed, Stage};
use crate::segments::{self, Buf, Segment};
use crate::store::{Store, WriterState};
use crate::sums::binding;

/// The serial heart of the pipeline, behind one mutex held for microseconds at a time.
struct Sequencer {
    /// The next segment to place.
    next: usize,
    /// Compressed segments waiting for the ones before them.
    ready: BTreeMap<usize, Segment>,
    frontier: Frontier,
    entries: Vec<RecordLoc>,
    sums: Vec<SumEntry>,
    /// Chunks prepared (checked or created) for writing.
    touched: BTreeSet<u64>,
}

impl Store {
    /// Appends the compressed records of `ranges` through the pipeline; the caller holds the
    /// writer mutex (`state`) and has checked the limits.
    pub(crate) fn append_pipelined(
        &self,
        src: &[u8],
        ranges: &[(usize, usize)],
        segs: &[Range<usize>],
        codec: Codec,
        state: &mut WriterState,
    ) -> Result<u64> {
        let first = self.len();
        let with_sums = self.has_checksums();
        let (tail_chunk, tail_offset) = (state.tail_chunk, state.tail_offset);
        self.failpoints.hit("append:before-data").map_err(Error::internal)?;
        let seq = Mutex::new(Sequencer {
            next: 0,
            ready: BTreeMap::new(),
            frontier: Frontier::new(tail_chunk, tail_offset, self.chunks.capacity()),
            entries: Vec::with_capacity(ranges.len()),
            sums: Vec::with_capacity(if with_sums { ranges.len() } else { 0 }),
            touched: BTreeSet::new(),
        });
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let dict = self.dictionary();
        let worker = || -> Result<()> {
            let mut encoder = Encoder::new(dict, with_sums);
            while !failed.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(records) = segs.get(i) else { break };
                let mut step = || -> Result<()> {
                    let seg = segments::compress(
                        &mut encoder,
                        src,
                        ranges,
                        records.clone(),
                        codec,
                        with_sums,
                        &self.out_bufs,
                    )?;
                    let placed = self.place_ready(&seq, i, seg, (tail_chunk, tail_offset))?;
                    for (seg, writes) in placed {
                        for w in &writes {
                            let bytes = match w.buf {
                                Buf::Caller => &src[w.range.0..w.range.1],
                                Buf::Shard(_) => &seg.out[w.range.0..w.range.1],
                            };
                            self.chunks.get(w.chunk)?.write(w.offset, bytes)?;
                        }
                        self.out_bufs.give(seg.out);
                    }
                    Ok(())
                };
                if let Err(e) = step() {
                    failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
            Ok(())
        };
        run_workers(num_threads().min(segs.len()), worker)?;
        let seq = seq.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        if seq.next != segs.len() || seq.entries.len() != ranges.len() {
            return Err(Error::internal("the append pipeline stopped before the last segment"));
        }
        state.dirty_chunks.extend(seq.touched.iter().copied());
        let sums = with_sums.then_some(seq.sums.as_slice());
        self.commit(state, first, &seq.entries, sums, seq.frontier)
    }

    /// Files segment `i` with the sequencer and places every segment now next in line:
    /// their table entries and checksums are filed, their chunks prepared, and they are
    /// returned with their writes for the calling worker to do.
    fn place_ready(
        &self,
        seq: &Mutex<Sequencer>,
        i: usize,
        seg: Segment,
        tail: (u64, u64),
    ) -> Result<Vec<(Segment, Vec<Write>)>> {
        let mut guard = seq.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let s = &mut *guard;
        s.ready.insert(i, seg);
        let mut placed = Vec::new();
        while let Some(seg) = s.ready.remove(&s.next) {
            let (entries, writes) = timed(Stage::Plan, || plan(&seg.pending, &mut s.frontier))?;
            for w in &writes {
                if s.touched.insert(w.chunk) {
                    self.prepare_chunk(tail.0, tail.1, w.chunk)?;
                }
            }
            s.sums.extend(
                seg.sums
                    .iter()
                    .zip(&entries)
                    .map(|(&sum, loc)| SumEntry { sum, binding: binding(loc) }),
            );
            s.entries.extend_from_slice(&entries);
            s.next += 1;
            placed.push((seg, writes));
        }
        Ok(placed)
    }
}
