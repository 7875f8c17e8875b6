//! `gather_parts`: byte ranges of records rather than whole records. A packed token row reads a
//! window of each document it spans; a raw record's window is copied from the chunk map alone,
//! and a compressed record, which cannot be decoded in part, is decoded once per call however
//! many windows of it the call asks for (the windows of one record are read together).
//!
//! [`gather_parts_across`] reads the windows of several stores in one parallel job: a batch of
//! a mixture of packed sources is one hand-off to the pool, as a batch of one store is.

use crate::codec::Decoder;
use crate::error::{Error, Result};
use crate::format::{Codec, RecordLoc};
use crate::gather::for_record;
use crate::pool::run_sharded_at_most;
use crate::store::Store;
use crate::sums::Sums;

/// One window to read: bytes `start .. start + dst.len()` of its record.
struct Part<'d> {
    start: u64,
    dst: &'d mut [u8],
}

/// The windows of one record of the store `source` (its place in the call's list).
struct Group<'d> {
    source: usize,
    index: u64,
    loc: RecordLoc,
    parts: Vec<Part<'d>>,
}

/// One store's windows in a read over several stores ([`gather_parts_across`]): bytes
/// `starts[i] .. starts[i] + lens[i]` of its record `indices[i]` into
/// `dst[dst_offsets[i]..][..lens[i]]`.
pub struct StoreParts<'a> {
    pub store: &'a Store,
    pub indices: &'a [u64],
    pub starts: &'a [u64],
    pub lens: &'a [u64],
    pub dst: &'a mut [u8],
    pub dst_offsets: &'a [u64],
}

impl Store {
    /// Copies bytes `starts[i] .. starts[i] + lens[i]` of record `indices[i]` into
    /// `dst[dst_offsets[i]..][..lens[i]]` for every `i`. Windows must lie inside their records and
    /// destination ranges inside `dst`, without overlapping each other; a refused call writes
    /// nothing. Checked reads (`verify_reads`) read each record whole to check it.
    pub fn gather_parts(
        &self,
        indices: &[u64],
        starts: &[u64],
        lens: &[u64],
        dst: &mut [u8],
        dst_offsets: &[u64],
    ) -> Result<()> {
        self.gather_parts_at_most(indices, starts, lens, dst, dst_offsets, usize::MAX)
    }

    /// [`Store::gather_parts`] split into at most `max_shards` parallel blocks (1: on the
    /// calling thread): a loader's workers, already running side by side, ask for few, and a
    /// small batch is cheaper on one thread than handed to the pool.
    pub fn gather_parts_at_most(
        &self,
        indices: &[u64],
        starts: &[u64],
        lens: &[u64],
        dst: &mut [u8],
        dst_offsets: &[u64],
        max_shards: usize,
    ) -> Result<()> {
        let one = StoreParts { store: self, indices, starts, lens, dst, dst_offsets };
        gather_parts_across(&mut [one], max_shards)
    }

    /// The record windows of one store's share, checked and grouped by record; `source` is
    /// the share's place in the call.
    fn part_groups<'d>(
        &self,
        source: usize,
        read: &'d mut StoreParts<'_>,
        into: &mut Vec<Group<'d>>,
    ) -> Result<()> {
        let (indices, starts, lens) = (read.indices, read.starts, read.lens);
        let n = indices.len();
        let len = self.len();
        let mut locs = Vec::with_capacity(n);
        for i in 0..n {
            let index = indices[i];
            if index >= len {
                return Err(Error::IndexOutOfRange { index, len });
            }
            let loc = self.meta.entry(index);
            let end = starts[i].checked_add(lens[i]);
            if end.is_none_or(|end| end > u64::from(loc.logic_length)) {
                return Err(Error::invalid(format!(
                    "part {i} asks for bytes {}..{} of record {index}, which holds {}",
                    starts[i],
                    end.map_or_else(|| "past 2^64".to_string(), |e| e.to_string()),
                    loc.logic_length
                )));
            }
            locs.push(loc);
        }
        let pieces = split_windows(&mut *read.dst, lens, read.dst_offsets)?;
        group_by_record(source, indices, starts, &locs, pieces, into);
        Ok(())
    }

    /// Fills the windows of one record: straight from the map for a raw record (unless reads
    /// are checked against `sums`), else through one decode into `whole`.
    fn read_group(
        &self,
        g: &mut Group<'_>,
        sums: Option<&Sums>,
        whole: &mut Vec<u8>,
    ) -> Result<()> {
        let Some((codec, chunk)) = self.locate(g.index, &g.loc)? else { return Ok(()) };
        if codec == Codec::Raw && sums.is_none() {
            for p in &mut g.parts {
                let at = u64::from(g.loc.offset) + p.start;
                let bytes =
                    chunk.read(at, p.dst.len() as u64).map_err(|e| for_record(e, g.index))?;
                p.dst.copy_from_slice(bytes);
            }
            return Ok(());
        }
        whole.resize(g.loc.logic_length as usize, 0);
        self.read_record(g.index, &g.loc, whole, &mut Decoder::new(self.dictionary()))?;
        if let Some(sums) = sums {
            if sums.check(g.index, &g.loc, whole) == crate::sums::Verdict::Bad {
                let path = self.chunks.path(u64::from(g.loc.chunk_id));
                return Err(Error::checksum_mismatch(path, g.index));
            }
        }
        for p in &mut g.parts {
            let start = p.start as usize;
            p.dst.copy_from_slice(&whole[start..start + p.dst.len()]);
        }
        Ok(())
    }
}

/// The windows of several stores read in one parallel job (see [`Store::gather_parts`] for
/// one store's rules): the records of every share are grouped together and split into at most
/// `max_shards` blocks by their bytes, so a batch drawn from several stores costs one hand-off
/// to the pool, as a batch from one store does, instead of one per store. The shares' outputs
/// are their own (disjoint) buffers. Each store's records are located inside its own consistent
/// read (a store that moves records meanwhile is read again), and a refused call writes nothing.
pub fn gather_parts_across(reads: &mut [StoreParts<'_>], max_shards: usize) -> Result<()> {
    let stores: Vec<&Store> = reads.iter().map(|r| r.store).collect();
    let _guards = stores.iter().map(|s| s.activity.shared("gather")).collect::<Result<Vec<_>>>()?;
    for r in reads.iter() {
        let n = r.indices.len();
        if r.starts.len() != n || r.lens.len() != n || r.dst_offsets.len() != n {
            return Err(Error::invalid(format!(
                "{n} indices, {} starts, {} lengths and {} destination offsets: one of each per \
                 part",
                r.starts.len(),
                r.lens.len(),
                r.dst_offsets.len()
            )));
        }
    }
    // Checked reads are decided once per store and call, not per record.
    let sums: Vec<Option<&Sums>> = stores.iter().map(|s| s.checked_reads()).collect();
    within_consistent_reads(&stores, &mut || {
        let mut groups: Vec<Group<'_>> = Vec::new();
        for (source, r) in reads.iter_mut().enumerate() {
            stores[source].part_groups(source, r, &mut groups)?;
        }
        // The work a group costs: its windows' bytes for a raw record read unchecked (a token
        // row of a long document copies 1 KiB, not the document), else the record.
        let cost = |g: &Group<'_>| {
            if g.loc.codec == Codec::Raw as u8 && sums[g.source].is_none() {
                g.parts.iter().map(|p| p.dst.len()).sum()
            } else {
                g.loc.logic_length as usize
            }
        };
        let total: usize = groups.iter().map(cost).sum();
        run_sharded_at_most(&mut groups, total, max_shards, |block: &mut [Group<'_>]| {
            let mut whole = Vec::new();
            for g in block.iter_mut() {
                stores[g.source].read_group(g, sums[g.source], &mut whole)?;
            }
            Ok(())
        })
    })
}

/// Runs `read` inside a consistent read of every store of `stores` (nested, the first
/// outermost): a store whose records move meanwhile runs it again.
fn within_consistent_reads(stores: &[&Store], read: &mut dyn FnMut() -> Result<()>) -> Result<()> {
    match stores.split_first() {
        None => read(),
        Some((store, rest)) => store.consistent_read(|| within_consistent_reads(rest, read)),
    }
}

/// Cuts `dst` into one disjoint window per part (`lens[i]` bytes at `offsets[i]`), refusing
/// ranges past `dst` or overlapping each other.
fn split_windows<'d>(
    dst: &'d mut [u8],
    lens: &[u64],
    offsets: &[u64],
) -> Result<Vec<&'d mut [u8]>> {
    let dst_len = dst.len() as u64;
    let mut order: Vec<usize> = (0..lens.len()).collect();
    order.sort_by_key(|&i| offsets[i]);
    let mut pieces: Vec<Option<&'d mut [u8]>> = (0..lens.len()).map(|_| None).collect();
    let (mut rest, mut consumed) = (dst, 0u64);
    for &i in &order {
        let (start, size) = (offsets[i], lens[i]);
        if size == 0 {
            pieces[i] = Some(Default::default());
            continue;
        }
        let end = start.checked_add(size).filter(|&e| e <= dst_len);
        let Some(end) = end else {
            return Err(Error::invalid(format!(
                "destination too small: part {i} needs bytes {start}..{} but it has {dst_len}",
                start.saturating_add(size)
            )));
        };
        if start < consumed {
            return Err(Error::invalid(format!(
                "destination ranges overlap: part {i} at {start} starts before byte {consumed}"
            )));
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - consumed) as usize);
        let (mine, after) = tail.split_at_mut(size as usize);
        pieces[i] = Some(mine);
        rest = after;
        consumed = end;
    }
    Ok(pieces.into_iter().map(Option::unwrap_or_default).collect())
}

/// The parts grouped by record (in record order) onto `into`, so that each record is read or
/// decoded once. A sort rather than a hash map: a batch has tens of parts, where hashing and
/// the map's allocations cost more than the sort.
fn group_by_record<'d>(
    source: usize,
    indices: &[u64],
    starts: &[u64],
    locs: &[RecordLoc],
    pieces: Vec<&'d mut [u8]>,
    into: &mut Vec<Group<'d>>,
) {
    let mut order: Vec<(u64, usize)> = indices.iter().copied().zip(0..).collect();
    order.sort_unstable();
    let mut pieces: Vec<Option<&'d mut [u8]>> = pieces.into_iter().map(Some).collect();
    for (index, i) in order {
        let dst = pieces[i].take().unwrap_or_default();
        match into.last_mut() {
            Some(g) if g.source == source && g.index == index => {
                g.parts.push(Part { start: starts[i], dst });
            }
            _ => into.push(Group {
                source,
                index,
                loc: locs[i],
                parts: vec![Part { start: starts[i], dst }],
            }),
        }
    }
}
