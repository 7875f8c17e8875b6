//! `loaderx._native.MixedBatch`: one loader batch of a mixture (`loaderx.mix`) in one call,
//! with the GIL released -- the run of positions resolved (`zsampler::mixture`: each source's
//! draws before and in it, and their records), then every source's rows read in one parallel
//! job over the sources' stores: whole records of dense sources
//! (`zrecord::across::gather_fixed_shares`), or the document windows of packed views, planned
//! as `packed.rs` plans one view's batch, with their end tokens, segment ids and positions
//! (`zrecord::gather_parts_across`). The sources' fixed arguments are taken once, when it is
//! made; a batch that is not a run of positions is left to the Python path.

use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use zrecord::across::{gather_fixed_shares, FixedShare};
use zrecord::Store;

use crate::buffers::{slice, slice_mut};
use crate::errors::IntoPyResult;
use crate::exit::detach;
use crate::packed::{read, Out, Plan, PlanView, Share, Stored, StoredAs, StoredView};
use crate::store::Zrecord;

/// One packed view of a mixture, its fixed arguments taken once.
struct PackedSource {
    store: Py<Zrecord>,
    plan: Plan,
    stored: Stored,
    eos: Option<u64>,
}

/// What a mixture's sources are: all dense datasets (whole records of one size) or all packed
/// views (rows of one `seq_len`).
enum Sources {
    Dense(Vec<Py<Zrecord>>),
    Packed(Vec<PackedSource>),
}

/// A packed source as Python passes it: `(store, ("concat", starts, order) | ("first_fit",
/// row_ptr, row_docs, sizes, pad_id), eos_id, layout)`.
type PackedArgs<'py> = (Bound<'py, Zrecord>, Bound<'py, PyAny>, Option<u64>, StoredAs<'py>);

fn packed_source(args: PackedArgs<'_>) -> PyResult<PackedSource> {
    let (store, plan, eos, layout) = args;
    let kind: String = plan.get_item(0)?.extract()?;
    let plan = match kind.as_str() {
        "concat" => Plan::concat(plan.get_item(1)?.extract()?, &plan.get_item(2)?)?,
        "first_fit" => Plan::first_fit(
            plan.get_item(1)?.extract()?,
            &plan.get_item(2)?,
            &plan.get_item(3)?,
            plan.get_item(4)?.extract()?,
        )?,
        other => {
            return Err(crate::errors::bad_argument(format!(
                "a plan is 'concat' or 'first_fit', not {other:?}"
            )))
        }
    };
    Ok(PackedSource { store: store.unbind(), plan, stored: Stored::get(layout)?, eos })
}

/// A mixture's batches, read a run of positions at a time. See `loaderx._views.mixture`.
#[pyclass(name = "MixedBatch", module = "loaderx._native", frozen)]
pub struct MixedBatch {
    run: zsampler::mixture::MixedRun,
    sources: Sources,
    /// Items per row (a packed row's tokens; a dense record's bytes) and bytes per item.
    row_items: u64,
    itemsize: usize,
    /// Positions from this one on are not the mixture's.
    limit: u64,
}

/// The sources as one call reads them: engine handles, and packed views' plans borrowed.
enum Taken<'b> {
    Dense(Vec<Arc<Store>>),
    Packed(Vec<(Arc<Store>, PlanView<'b>, StoredView<'b>, Option<u64>)>),
}

#[pymethods]
impl MixedBatch {
    /// `MixedBatch(table, orders, dense, sources, row_items, itemsize, limit)`: the mixed order
    /// (see `MixedRun`) and each source, in the same order: its store when `dense` (records of
    /// `row_items` bytes, `itemsize` 1), else its packed view (see [`PackedArgs`]; rows of
    /// `row_items` tokens of `itemsize` bytes).
    #[new]
    fn new(
        table: PyBuffer<u16>,
        orders: Vec<(u64, u64, u64, u64)>,
        dense: bool,
        sources: Vec<Bound<'_, PyAny>>,
        row_items: u64,
        itemsize: usize,
        limit: u64,
    ) -> PyResult<Self> {
        let bad = |m: String| Err(crate::errors::bad_argument(m));
        if orders.len() != sources.len() || row_items == 0 || !(1..=8).contains(&itemsize) {
            return bad(format!(
                "{} orders for {} sources, {row_items} items a row of {itemsize} bytes: one \
                 order per source, rows of at least one item of 1 to 8 bytes",
                orders.len(),
                sources.len()
            ));
        }
        if dense && itemsize != 1 {
            return bad("dense records are counted in bytes: itemsize 1".into());
        }
        let run = crate::sampler::mixed_run(&table, orders)?;
        let sources = if dense {
            Sources::Dense(
                sources
                    .iter()
                    .map(|s| Ok(s.cast::<Zrecord>()?.clone().unbind()))
                    .collect::<PyResult<_>>()?,
            )
        } else {
            Sources::Packed(
                sources.iter().map(|s| packed_source(s.extract()?)).collect::<PyResult<_>>()?,
            )
        };
        Ok(Self { run, sources, row_items, itemsize, limit })
    }

    /// `fill(positions, dst, segments, positions_out, sources, records, max_shards)`: the batch
    /// of the mixture's positions `positions` (uint64) when they are a run (`first, first + 1,
    /// ...`; else None and nothing is written): the rows grouped by source, each source's in
    /// its draw order, into `dst`; for packed sources their segment ids and positions into
    /// `segments` and `positions_out` (int32; None for dense ones); each row's source into
    /// `sources` (int32, or None) and its record (the source's row) into `records` (uint64).
    /// Returns each source's draws before the run and in it.
    #[pyo3(signature = (positions, dst, segments, positions_out, sources, records, max_shards))]
    #[allow(clippy::too_many_arguments, reason = "one batch and its outputs")]
    fn fill(
        &self,
        py: Python<'_>,
        positions: PyBuffer<u64>,
        dst: PyBuffer<u8>,
        segments: Option<PyBuffer<i32>>,
        positions_out: Option<PyBuffer<i32>>,
        sources: Option<PyBuffer<i32>>,
        records: PyBuffer<u64>,
        max_shards: Option<usize>,
    ) -> PyResult<Option<(Vec<u64>, Vec<u64>)>> {
        let at = slice(&positions, "positions")?;
        let n = at.len();
        let first = at.first().copied().unwrap_or(0);
        let is_run = n > 0
            && first.checked_add(n as u64).is_some_and(|end| end <= self.limit)
            && at.iter().zip(first..).all(|(&p, want)| p == want);
        if !is_run {
            return Ok(None);
        }
        let records = slice_mut(&records, "records")?;
        let src = sources.as_ref().map(|b| slice_mut(b, "sources")).transpose()?;
        if records.len() != n || src.as_ref().is_some_and(|s| s.len() != n) {
            return Err(crate::errors::bad_argument(format!(
                "records and sources must hold one entry per position ({n})"
            )));
        }
        let marks = match (&self.sources, &segments, &positions_out) {
            (Sources::Packed(_), Some(seg), Some(pos)) => Some((seg, pos)),
            (Sources::Dense(_), None, None) => None,
            _ => {
                return Err(crate::errors::bad_argument(
                    "segment ids and positions go with packed sources, and only with them",
                ))
            }
        };
        let (row_items, itemsize) = (self.row_items, self.itemsize);
        let out = Out::get(n as u64 * row_items, itemsize, &dst, marks)?;
        let row_bytes = usize::try_from(row_items).unwrap_or(usize::MAX) * itemsize;
        let k = self.run.sources();
        let (mut starts, mut takes) = (vec![0u64; k], vec![0u64; k]);
        // The sources' engine handles and borrowed plans, taken with the GIL.
        let taken = match &self.sources {
            Sources::Dense(stores) => {
                Taken::Dense(stores.iter().map(|s| s.get().handle()).collect::<PyResult<_>>()?)
            }
            Sources::Packed(views) => Taken::Packed(
                views
                    .iter()
                    .map(|v| {
                        Ok((v.store.get().handle()?, v.plan.borrow()?, v.stored.borrow()?, v.eos))
                    })
                    .collect::<PyResult<_>>()?,
            ),
        };
        let shards = max_shards.unwrap_or(usize::MAX);
        detach(py, || -> zrecord::Result<()> {
            let bad = |e: zsampler::SamplerError| zrecord::Error::InvalidArgument(e.to_string());
            self.run.run(first, records, &mut starts, &mut takes).map_err(bad)?;
            let records: &[u64] = records;
            // Each source's rows: a run of the batch, `takes[s]` long, in source order.
            let mut bounds = Vec::with_capacity(k);
            let mut lo = 0usize;
            for &take in &takes {
                let m = usize::try_from(take).unwrap_or(usize::MAX).min(n - lo);
                bounds.push(lo..lo + m);
                lo += m;
            }
            if let Some(src) = src {
                for (s, rows) in bounds.iter().enumerate() {
                    src[rows.clone()].fill(i32::try_from(s).unwrap_or(i32::MAX));
                }
            }
            let tokens = |rows: &std::ops::Range<usize>| rows.len() * row_items as usize;
            let mut rest = out;
            match taken {
                Taken::Dense(stores) => {
                    let mut shares = Vec::with_capacity(k);
                    for (store, rows) in stores.iter().zip(&bounds) {
                        let (mine, after) = rest.split(tokens(rows), itemsize);
                        rest = after;
                        shares.push(FixedShare {
                            store,
                            indices: &records[rows.clone()],
                            dst: mine.dst,
                        });
                    }
                    gather_fixed_shares(&mut shares, row_bytes, shards)
                }
                Taken::Packed(views) => {
                    let mut shares = Vec::with_capacity(k);
                    for ((store, plan, stored, eos), rows) in views.into_iter().zip(&bounds) {
                        let (mine, after) = rest.split(tokens(rows), itemsize);
                        rest = after;
                        let rows = &records[rows.clone()];
                        shares.push(Share::plan(
                            store, plan, stored, rows, row_items, eos, itemsize, mine,
                        )?);
                    }
                    read(&mut shares, itemsize, shards)
                }
            }
        })
        .py()?;
        Ok(Some((starts, takes)))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MixedBatch>()
}
