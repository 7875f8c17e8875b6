//! Reads over several stores in one call: a concatenation of stores (a dataset converted in
//! parts, one store per part) reads a batch whose records lie in many of them. Each store's
//! records of the batch go to it in one call of its own, so every guarantee of a single-store
//! read holds per store; what this saves is the caller's work per store -- locating and
//! grouping the batch, and, from Python, one crossing of the binding per store.
//!
//! The stores are one index space: store `k` holds the records `starts[k]..starts[k + 1]`
//! ([`Starts`]: one entry more than there are stores, from 0, never decreasing, checked once
//! when made), so record `i` of the concatenation is record `i - starts[k]` of the store `k`
//! whose range holds it.
//! The batch is located by a binary search of `starts` per record and grouped by a counting
//! sort into one array, so each store sees its records in batch order, and one pair of index
//! buffers serves every store of a call. A call that fails may have written the records of the
//! stores before the failing one; an index past the last store fails before anything is read.
//!
//! [`gather_fixed_shares`] is the other shape: each store's records already chosen (a mixture's
//! sources), read in one parallel job rather than one per store.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::pool::{num_threads, run_sharded_at_most, MIN_SHARD_BYTES};
use crate::store::Store;

/// The batch located and grouped by store: `local[i]` is record `i`'s index in its store, and
/// store `k`'s records are the batch positions `bounds[k]..bounds[k + 1]` -- of the batch
/// itself when its stores never decrease (a sorted batch: no reordering at all), else of
/// `order`, the positions store by store (each store's in batch order, a counting sort).
struct Groups {
    local: Vec<u64>,
    bounds: Vec<usize>,
    order: Option<Vec<usize>>,
}

/// A store's records of the batch: a run of batch positions, or positions picked from it.
enum Positions<'a> {
    Run(Range<usize>),
    Picked(&'a [usize]),
}

impl Groups {
    fn new(stores: &[&Store], starts: &Starts, indices: &[u64]) -> Result<Self> {
        if stores.len() != starts.stores() {
            return Err(Error::invalid(format!(
                "{} stores, but start offsets for {}",
                stores.len(),
                starts.stores()
            )));
        }
        let (stores, total, starts) = (starts.stores(), starts.total(), &starts.0[..]);
        let mut part = Vec::with_capacity(indices.len());
        let mut local = Vec::with_capacity(indices.len());
        let mut bounds = vec![0usize; stores + 1];
        let (mut k, mut sorted) = (0usize, true);
        for &index in indices {
            if index >= total {
                return Err(Error::IndexOutOfRange { index, len: total });
            }
            // Most batches are sorted: the previous record's store is tried first. Otherwise
            // the last store starting at or before `index` (an empty store starts where the
            // next one does, and is passed over).
            if !(starts[k] <= index && index < starts[k + 1]) {
                let found = starts.partition_point(|&s| s <= index) - 1;
                sorted &= found > k;
                k = found;
            }
            part.push(k);
            local.push(index - starts[k]);
            bounds[k + 1] += 1;
        }
        for k in 0..stores {
            bounds[k + 1] += bounds[k];
        }
        let order = (!sorted).then(|| {
            let mut next = bounds.clone();
            let mut order = vec![0usize; indices.len()];
            for (i, &k) in part.iter().enumerate() {
                order[next[k]] = i;
                next[k] += 1;
            }
            order
        });
        Ok(Groups { local, bounds, order })
    }

    /// `(store, positions)` for each store with records in the batch, in store order.
    fn each(&self) -> impl Iterator<Item = (usize, Positions<'_>)> {
        self.bounds.windows(2).enumerate().filter(|(_, w)| w[1] > w[0]).map(|(k, w)| {
            let at = match &self.order {
                None => Positions::Run(w[0]..w[1]),
                Some(order) => Positions::Picked(&order[w[0]..w[1]]),
            };
            (k, at)
        })
    }
}

/// Where each store of a concatenation starts: one offset more than there are stores, from 0,
/// never decreasing (store `k` holds records `starts[k]..starts[k + 1]`). Checked once, when
/// made, so that a read need not check it again.
#[derive(Clone, Debug)]
pub struct Starts(Vec<u64>);

impl Starts {
    /// The start offsets of `stores` stores.
    ///
    /// # Errors
    /// `InvalidArgument` naming what is wrong.
    pub fn new(stores: usize, starts: Vec<u64>) -> Result<Self> {
        if starts.len() != stores + 1 {
            return Err(Error::invalid(format!(
                "{stores} stores need {} start offsets, got {}",
                stores + 1,
                starts.len()
            )));
        }
        if starts[0] != 0 || starts.windows(2).any(|w| w[1] < w[0]) {
            return Err(Error::invalid("store start offsets must begin at 0 and never decrease"));
        }
        Ok(Starts(starts))
    }

    /// The number of stores.
    pub fn stores(&self) -> usize {
        self.0.len() - 1
    }

    /// The number of records of the concatenation.
    pub fn total(&self) -> u64 {
        self.0[self.0.len() - 1]
    }
}

/// `values[i]` for each of `positions`, into `out` (cleared first): one buffer serves every
/// store of a call.
fn pick(values: &[u64], positions: &[usize], out: &mut Vec<u64>) {
    out.clear();
    out.extend(positions.iter().map(|&i| values[i]));
}

/// [`Store::gather_fixed_at`] over several stores: record `indices[i]` of the concatenation
/// into row `i` of `dst` (or row `rows[i]`, strictly increasing).
///
/// # Errors
/// Other stores than `starts` describes, an index past the concatenation, or what a
/// store's own gather refuses.
pub fn gather_fixed_across(
    stores: &[&Store],
    starts: &Starts,
    indices: &[u64],
    rows: Option<&[u64]>,
    dst: &mut [u8],
    record_len: usize,
    max_shards: usize,
) -> Result<()> {
    match rows {
        Some(r) if r.len() != indices.len() => {
            return Err(Error::invalid("one destination row per index"));
        }
        None if indices.len().checked_mul(record_len) != Some(dst.len()) => {
            return Err(Error::invalid(format!(
                "destination holds {} bytes, not {} records of {record_len} bytes",
                dst.len(),
                indices.len()
            )));
        }
        _ => {}
    }
    let groups = Groups::new(stores, starts, indices)?;
    let (mut local, mut into) = (Vec::new(), Vec::new());
    for (k, positions) in groups.each() {
        match positions {
            // A run of rows: the store fills its own slice of `dst` (or its run of `rows`).
            Positions::Run(run) => {
                let local = &groups.local[run.clone()];
                match rows {
                    None => {
                        let bytes = run.start * record_len..run.end * record_len;
                        stores[k].gather_fixed_at(
                            local,
                            None,
                            &mut dst[bytes],
                            record_len,
                            max_shards,
                        )?;
                    }
                    Some(r) => {
                        stores[k].gather_fixed_at(
                            local,
                            Some(&r[run]),
                            dst,
                            record_len,
                            max_shards,
                        )?;
                    }
                }
            }
            Positions::Picked(positions) => {
                pick(&groups.local, positions, &mut local);
                if let Some(r) = rows {
                    pick(r, positions, &mut into);
                } else {
                    into.clear();
                    into.extend(positions.iter().map(|&i| i as u64));
                }
                stores[k].gather_fixed_at(&local, Some(&into), dst, record_len, max_shards)?;
            }
        }
    }
    Ok(())
}

/// One store's records in [`gather_fixed_shares`]: record `indices[i]` into row `i` of `dst`.
pub struct FixedShare<'a> {
    pub store: &'a Store,
    pub indices: &'a [u64],
    pub dst: &'a mut [u8],
}

/// A piece of a share, read by one block.
struct Piece<'a> {
    store: &'a Store,
    indices: &'a [u64],
    dst: &'a mut [u8],
}

/// Several stores' records of `record_len` bytes in one parallel job: the shares' rows, end to
/// end, are cut into at most `max_shards` blocks of about equal size (a block may span two
/// stores), each read on one thread by one single-threaded gather per store in it
/// ([`Store::gather_fixed_at`]: its checks, its consistent read, its cold path). A batch over
/// several stores so hands work to the pool once, as one store's batch does, instead of once
/// per store. Every share's sizes and indices are checked before anything is read; a record of
/// the wrong length is found by its piece's gather, which may come after other pieces wrote.
///
/// # Errors
/// A destination that does not hold its share's records, an index past its store, or what a
/// store's own gather refuses.
pub fn gather_fixed_shares(
    shares: &mut [FixedShare<'_>],
    record_len: usize,
    max_shards: usize,
) -> Result<()> {
    for s in shares.iter() {
        if s.indices.len().checked_mul(record_len) != Some(s.dst.len()) {
            return Err(Error::invalid(format!(
                "destination holds {} bytes, not {} records of {record_len} bytes",
                s.dst.len(),
                s.indices.len()
            )));
        }
        let len = s.store.len();
        if let Some(&index) = s.indices.iter().find(|&&i| i >= len) {
            return Err(Error::IndexOutOfRange { index, len });
        }
    }
    let rows: usize = shares.iter().map(|s| s.indices.len()).sum();
    let total = rows.saturating_mul(record_len);
    let blocks =
        num_threads().min(max_shards).min(rows).min((total / MIN_SHARD_BYTES).max(1)).max(1);
    let per = rows.div_ceil(blocks).max(1);
    // Block b holds the rows b * per .. (b + 1) * per of the shares end to end.
    let mut items: Vec<Vec<Piece<'_>>> = (0..blocks).map(|_| Vec::new()).collect();
    let mut at = 0usize;
    for s in shares.iter_mut() {
        let (mut indices, mut dst) = (s.indices, &mut *s.dst);
        while !indices.is_empty() {
            let block = at / per;
            let take = indices.len().min((block + 1) * per - at);
            let (mine, rest) = indices.split_at(take);
            let (into, tail) = std::mem::take(&mut dst).split_at_mut(take * record_len);
            items[block].push(Piece { store: s.store, indices: mine, dst: into });
            (indices, dst, at) = (rest, tail, at + take);
        }
    }
    run_sharded_at_most(&mut items, total, max_shards, |block: &mut [Vec<Piece<'_>>]| {
        for piece in block.iter_mut().flatten() {
            piece.store.gather_fixed_at(piece.indices, None, piece.dst, record_len, 1)?;
        }
        Ok(())
    })
}

/// [`Store::gather`] over several stores: record `indices[i]` of the concatenation into `dst`
/// at byte `offsets[i]`.
///
/// # Errors
/// Other stores than `starts` describes, an index past the concatenation, or what a
/// store's own gather refuses.
pub fn gather_across(
    stores: &[&Store],
    starts: &Starts,
    indices: &[u64],
    dst: &mut [u8],
    offsets: &[u64],
) -> Result<()> {
    if offsets.len() != indices.len() {
        return Err(Error::invalid("one destination offset per index"));
    }
    let groups = Groups::new(stores, starts, indices)?;
    let (mut local, mut at) = (Vec::new(), Vec::new());
    for (k, positions) in groups.each() {
        match positions {
            Positions::Run(run) => {
                stores[k].gather(&groups.local[run.clone()], dst, &offsets[run])?;
            }
            Positions::Picked(positions) => {
                pick(&groups.local, positions, &mut local);
                pick(offsets, positions, &mut at);
                stores[k].gather(&local, dst, &at)?;
            }
        }
    }
    Ok(())
}

/// [`Store::lengths`] over several stores: the logical length of record `indices[i]` of the
/// concatenation.
///
/// # Errors
/// Other stores than `starts` describes, an index past the concatenation, or past its
/// store's own length.
pub fn lengths_across(stores: &[&Store], starts: &Starts, indices: &[u64]) -> Result<Vec<u32>> {
    let mut out = vec![0u32; indices.len()];
    let groups = Groups::new(stores, starts, indices)?;
    let mut local = Vec::new();
    for (k, positions) in groups.each() {
        match positions {
            Positions::Run(run) => {
                out[run.clone()].copy_from_slice(&stores[k].lengths(&groups.local[run])?);
            }
            Positions::Picked(positions) => {
                pick(&groups.local, positions, &mut local);
                for (&i, len) in positions.iter().zip(stores[k].lengths(&local)?) {
                    out[i] = len;
                }
            }
        }
    }
    Ok(out)
}
