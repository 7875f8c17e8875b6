//! Reads over several stores in one call: a concatenation of stores (a dataset converted in
//! parts, one store per part) reads a batch whose records lie in many of them. Each store's
//! records of the batch go to it in one call of its own, so every guarantee of a single-store
//! read holds per store; what this saves is the caller's work per store -- grouping the batch,
//! and, from Python, one crossing of the binding per store.
//!
//! `parts[i]` names the store of `indices[i]` (an index into `stores`). The batch is grouped by
//! a counting sort into one array, so each store sees its records in batch order, and one pair
//! of index buffers serves every store of a call. A call that fails may have written the records
//! of the stores before the failing one.

use crate::error::{Error, Result};
use crate::store::Store;

/// The batch grouped by store: `order` holds the batch positions store by store (each store's
/// in batch order, a counting sort), and store `k`'s are `order[bounds[k]..bounds[k + 1]]`.
struct Groups {
    order: Vec<usize>,
    bounds: Vec<usize>,
}

impl Groups {
    fn new(stores: usize, parts: &[u32], len: usize) -> Result<Self> {
        if parts.len() != len {
            return Err(Error::invalid(format!("{len} indices but {} part numbers", parts.len())));
        }
        let mut bounds = vec![0usize; stores + 1];
        for (i, &p) in parts.iter().enumerate() {
            let slot = bounds.get_mut(p as usize + 1).filter(|_| (p as usize) < stores);
            *slot.ok_or_else(|| {
                Error::invalid(format!(
                    "part number {p} at position {i}, but there are {stores} stores"
                ))
            })? += 1;
        }
        for k in 0..stores {
            bounds[k + 1] += bounds[k];
        }
        let mut next = bounds.clone();
        let mut order = vec![0usize; len];
        for (i, &p) in parts.iter().enumerate() {
            order[next[p as usize]] = i;
            next[p as usize] += 1;
        }
        Ok(Groups { order, bounds })
    }

    /// `(store, positions)` for each store with records in the batch, in store order.
    fn each(&self) -> impl Iterator<Item = (usize, &[usize])> {
        self.bounds
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] > w[0])
            .map(|(k, w)| (k, &self.order[w[0]..w[1]]))
    }
}

/// `values[i]` for each of `positions`, into `out` (cleared first): one buffer serves every
/// store of a call.
fn pick(values: &[u64], positions: &[usize], out: &mut Vec<u64>) {
    out.clear();
    out.extend(positions.iter().map(|&i| values[i]));
}

/// [`Store::gather_fixed_at`] over several stores: record `indices[i]` of store `parts[i]`
/// into row `i` of `dst` (or row `rows[i]`, strictly increasing).
///
/// # Errors
/// A part number past `stores`, or what a store's own gather refuses.
pub fn gather_fixed_across(
    stores: &[&Store],
    parts: &[u32],
    indices: &[u64],
    rows: Option<&[u64]>,
    dst: &mut [u8],
    record_len: usize,
    max_shards: usize,
) -> Result<()> {
    if rows.is_some_and(|r| r.len() != indices.len()) {
        return Err(Error::invalid("one destination row per index"));
    }
    let groups = Groups::new(stores.len(), parts, indices.len())?;
    let (mut local, mut into) = (Vec::new(), Vec::new());
    for (k, positions) in groups.each() {
        pick(indices, positions, &mut local);
        if let Some(r) = rows {
            pick(r, positions, &mut into);
        } else {
            into.clear();
            into.extend(positions.iter().map(|&i| i as u64));
        }
        stores[k].gather_fixed_at(&local, Some(&into), dst, record_len, max_shards)?;
    }
    Ok(())
}

/// [`Store::gather`] over several stores: record `indices[i]` of store `parts[i]` into `dst`
/// at byte `offsets[i]`.
///
/// # Errors
/// A part number past `stores`, or what a store's own gather refuses.
pub fn gather_across(
    stores: &[&Store],
    parts: &[u32],
    indices: &[u64],
    dst: &mut [u8],
    offsets: &[u64],
) -> Result<()> {
    if offsets.len() != indices.len() {
        return Err(Error::invalid("one destination offset per index"));
    }
    let groups = Groups::new(stores.len(), parts, indices.len())?;
    let (mut local, mut at) = (Vec::new(), Vec::new());
    for (k, positions) in groups.each() {
        pick(indices, positions, &mut local);
        pick(offsets, positions, &mut at);
        stores[k].gather(&local, dst, &at)?;
    }
    Ok(())
}

/// [`Store::lengths`] over several stores: the logical length of record `indices[i]` of store
/// `parts[i]`.
///
/// # Errors
/// A part number past `stores`, or an index past its store's length.
pub fn lengths_across(stores: &[&Store], parts: &[u32], indices: &[u64]) -> Result<Vec<u32>> {
    let mut out = vec![0u32; indices.len()];
    let groups = Groups::new(stores.len(), parts, indices.len())?;
    let mut local = Vec::new();
    for (k, positions) in groups.each() {
        pick(indices, positions, &mut local);
        for (&i, len) in positions.iter().zip(stores[k].lengths(&local)?) {
            out[i] = len;
        }
    }
    Ok(out)
}
