//! Reads over several stores in one call: a concatenation of stores (a dataset converted in
//! parts, one store per part) reads a batch whose records lie in many of them. Each store's
//! records of the batch go to it in one call of its own, so every guarantee of a single-store
//! read holds per store; what this saves is the caller's work per store -- grouping the batch,
//! and, from Python, one crossing of the binding per store.
//!
//! `parts[i]` names the store of `indices[i]` (an index into `stores`). The batch is grouped by
//! a counting sort, so each store sees its records in batch order. A call that fails may have
//! written the records of the stores before the failing one.

use crate::error::{Error, Result};
use crate::store::Store;

/// The batch positions of each store's records, in batch order: `(store, positions)` for the
/// stores that have any, in store order.
fn groups(stores: usize, parts: &[u32], len: usize) -> Result<Vec<(usize, Vec<usize>)>> {
    if parts.len() != len {
        return Err(Error::invalid(format!("{len} indices but {} part numbers", parts.len())));
    }
    let mut by_store: Vec<Vec<usize>> = vec![Vec::new(); stores];
    for (i, &p) in parts.iter().enumerate() {
        let slot = by_store.get_mut(p as usize).ok_or_else(|| {
            Error::invalid(format!(
                "part number {p} at position {i}, but there are {stores} stores"
            ))
        })?;
        slot.push(i);
    }
    Ok(by_store.into_iter().enumerate().filter(|(_, g)| !g.is_empty()).collect())
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
    for (k, positions) in groups(stores.len(), parts, indices.len())? {
        let local: Vec<u64> = positions.iter().map(|&i| indices[i]).collect();
        let into: Vec<u64> = match rows {
            Some(r) => positions.iter().map(|&i| r[i]).collect(),
            None => positions.iter().map(|&i| i as u64).collect(),
        };
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
    for (k, positions) in groups(stores.len(), parts, indices.len())? {
        let local: Vec<u64> = positions.iter().map(|&i| indices[i]).collect();
        let at: Vec<u64> = positions.iter().map(|&i| offsets[i]).collect();
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
    for (k, positions) in groups(stores.len(), parts, indices.len())? {
        let local: Vec<u64> = positions.iter().map(|&i| indices[i]).collect();
        for (&i, len) in positions.iter().zip(stores[k].lengths(&local)?) {
            out[i] = len;
        }
    }
    Ok(out)
}
