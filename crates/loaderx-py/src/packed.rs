//! `loaderx._native.pack_concat` / `pack_first_fit`: one batch of a packed view in one call.
//! The rows' parts come from the plan (`zsampler::packing`), their windows are gathered from
//! the store (`zrecord`), then the end tokens, the padding, the segment ids and the positions
//! are written, all with the GIL released. The plan's arrays are borrowed, never copied.
//!
//! The pieces are shared with `mixed.rs`, which reads a batch of several packed views (a
//! mixture's sources) in one call.

use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use zrecord::StoreParts;
use zsampler::packing::{self, Layout, LayoutError, Part, Windows};

use crate::buffers::{slice, slice_mut, IndexBuffer, Indices};
use crate::errors::IntoPyResult;
use crate::exit::detach;
use crate::store::Zrecord;

/// Where a packed view's documents are stored, as Python passes it: `(first_record,
/// piece_rows, view)` (see [`pack_concat`]).
pub(crate) type StoredAs<'py> = (Option<Bound<'py, PyAny>>, u64, Option<PyBuffer<u64>>);

/// Where a packed view's documents are stored, taken as buffers.
pub(crate) struct Stored {
    first: Option<IndexBuffer>,
    piece_rows: u64,
    view: Option<PyBuffer<u64>>,
}

impl Stored {
    pub(crate) fn get(layout: StoredAs<'_>) -> PyResult<Self> {
        let (first, piece_rows, view) = layout;
        let first = first.as_ref().map(|f| IndexBuffer::get(f, "first_record")).transpose()?;
        if first.is_none() != (piece_rows == 0) {
            return Err(crate::errors::bad_argument(
                "first_record and piece_rows > 0 go together (documents in pieces)",
            ));
        }
        Ok(Self { first, piece_rows, view })
    }

    pub(crate) fn borrow(&self) -> PyResult<StoredView<'_>> {
        Ok(StoredView {
            first: self.first.as_ref().map(IndexBuffer::values).transpose()?,
            piece_rows: self.piece_rows,
            view: self.view.as_ref().map(|v| slice(v, "view")).transpose()?,
        })
    }
}

/// [`Stored`] borrowed for one call.
#[derive(Clone, Copy)]
pub(crate) struct StoredView<'b> {
    first: Option<Indices<'b>>,
    piece_rows: u64,
    view: Option<&'b [u64]>,
}

impl StoredView<'_> {
    /// The store's windows of `parts`, tokens of `itemsize` bytes.
    fn windows(&self, parts: &[Part], itemsize: usize) -> zrecord::Result<Windows> {
        let first = self.first.map(|f| move |doc: u64| f.try_get(doc));
        let first_dyn: Option<&(dyn Fn(u64) -> Option<u64> + Sync)> =
            first.as_ref().map(|f| f as &(dyn Fn(u64) -> Option<u64> + Sync));
        let layout =
            Layout { first_record: first_dyn, piece_rows: self.piece_rows, view: self.view };
        packing::windows(parts, layout, itemsize as u64).map_err(|e| {
            zrecord::Error::InvalidArgument(match e {
                LayoutError::Document(d) => format!("document {d} is not in the plan"),
                LayoutError::Record(r) => format!("record {r} is outside the view"),
            })
        })
    }
}

/// A packed view's plan, as Python holds it.
pub(crate) enum Plan {
    /// The `k`-th document of the stream is `order[k]`, starting at token `starts[k]`.
    Concat { starts: PyBuffer<i64>, order: IndexBuffer },
    /// Row `r` holds documents `row_docs[row_ptr[r]..row_ptr[r + 1]]`, `sizes[doc]` tokens
    /// each, the rest padding.
    FirstFit { row_ptr: PyBuffer<i64>, row_docs: IndexBuffer, sizes: IndexBuffer, pad: u64 },
}

impl Plan {
    pub(crate) fn concat(starts: PyBuffer<i64>, order: &Bound<'_, PyAny>) -> PyResult<Self> {
        let order = IndexBuffer::get(order, "order")?;
        let (docs, got) = (order.len(), starts.item_count());
        if got != docs + 1 {
            return Err(crate::errors::bad_argument(format!(
                "a plan of {docs} documents needs {} starts (got {got})",
                docs + 1
            )));
        }
        Ok(Plan::Concat { starts, order })
    }

    pub(crate) fn first_fit(
        row_ptr: PyBuffer<i64>,
        row_docs: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        pad: u64,
    ) -> PyResult<Self> {
        Ok(Plan::FirstFit {
            row_ptr,
            row_docs: IndexBuffer::get(row_docs, "row_docs")?,
            sizes: IndexBuffer::get(sizes, "sizes")?,
            pad,
        })
    }

    pub(crate) fn borrow(&self) -> PyResult<PlanView<'_>> {
        Ok(match self {
            Plan::Concat { starts, order } => {
                PlanView::Concat { starts: slice(starts, "starts")?, order: order.values()? }
            }
            Plan::FirstFit { row_ptr, row_docs, sizes, pad } => PlanView::FirstFit {
                row_ptr: slice(row_ptr, "row_ptr")?,
                row_docs: row_docs.values()?,
                sizes: sizes.values()?,
                pad: *pad,
            },
        })
    }
}

/// [`Plan`] borrowed for one call.
#[derive(Clone, Copy)]
pub(crate) enum PlanView<'b> {
    Concat { starts: &'b [i64], order: Indices<'b> },
    FirstFit { row_ptr: &'b [i64], row_docs: Indices<'b>, sizes: Indices<'b>, pad: u64 },
}

impl PlanView<'_> {
    /// The parts of rows `rows` (`seq_len` tokens each) onto `out`; refuses a row past the
    /// plan.
    fn parts(
        self,
        rows: &[u64],
        seq_len: u64,
        eos: bool,
        out: &mut Vec<Part>,
    ) -> zrecord::Result<()> {
        let past =
            |row: u64| zrecord::Error::InvalidArgument(format!("row {row} is not in the plan"));
        match self {
            PlanView::Concat { starts, order } => {
                let total = starts.last().copied().unwrap_or(0).max(0).cast_unsigned();
                if let Some(&r) = rows.iter().find(|&&r| r >= total / seq_len) {
                    return Err(past(r));
                }
                packing::concat_parts(starts, |k| order.get(k), seq_len, eos, rows, out);
                Ok(())
            }
            PlanView::FirstFit { row_ptr, row_docs, sizes, .. } => packing::first_fit_parts(
                row_ptr,
                |k: usize| row_docs.try_get(k as u64),
                |d| sizes.try_get(d),
                seq_len,
                eos,
                rows,
                out,
            )
            .map_err(past),
        }
    }

    /// The padding token, for a plan whose rows have some.
    fn pad(self) -> Option<u64> {
        match self {
            PlanView::Concat { .. } => None,
            PlanView::FirstFit { pad, .. } => Some(pad),
        }
    }
}

/// What one packed batch is written into: `dst` (tokens), `seg` and `pos` (one per token).
pub(crate) struct Out<'b> {
    pub(crate) dst: &'b mut [u8],
    seg: &'b mut [i32],
    pos: &'b mut [i32],
}

impl<'b> Out<'b> {
    /// The outputs for `tokens` tokens of `itemsize` bytes, checked and cut to that size; with
    /// no segment ids and positions (`segments: None`: whole records, not packed rows) those two
    /// are empty.
    pub(crate) fn get(
        tokens: u64,
        itemsize: usize,
        dst: &'b PyBuffer<u8>,
        segments: Option<(&'b PyBuffer<i32>, &'b PyBuffer<i32>)>,
    ) -> PyResult<Self> {
        if !(1..=8).contains(&itemsize) {
            return Err(crate::errors::bad_argument(format!(
                "itemsize must be 1..8, got {itemsize}"
            )));
        }
        let dst = slice_mut(dst, "destination")?;
        let (seg, pos): (&mut [i32], &mut [i32]) = match segments {
            Some((seg, pos)) => (slice_mut(seg, "segments")?, slice_mut(pos, "positions")?),
            None => (&mut [], &mut []),
        };
        let n = usize::try_from(tokens).unwrap_or(usize::MAX);
        let short = segments.is_some() && (seg.len() < n || pos.len() < n);
        if dst.len() / itemsize < n || short {
            return Err(crate::errors::bad_argument(format!(
                "the outputs must hold {tokens} tokens"
            )));
        }
        let m = seg.len().min(n);
        Ok(Out { dst: &mut dst[..n * itemsize], seg: &mut seg[..m], pos: &mut pos[..m] })
    }

    /// The first `tokens` tokens, and the rest.
    pub(crate) fn split(self, tokens: usize, itemsize: usize) -> (Out<'b>, Out<'b>) {
        let (d0, d1) = self.dst.split_at_mut(tokens * itemsize);
        let marks = tokens.min(self.seg.len());
        let (s0, s1) = self.seg.split_at_mut(marks);
        let (p0, p1) = self.pos.split_at_mut(marks);
        (Out { dst: d0, seg: s0, pos: p0 }, Out { dst: d1, seg: s1, pos: p1 })
    }
}

/// One source's share of a batch: its store, its parts and windows, and its outputs.
pub(crate) struct Share<'b> {
    store: Arc<zrecord::Store>,
    parts: Vec<Part>,
    windows: Windows,
    eos: Option<u64>,
    out: Out<'b>,
}

impl<'b> Share<'b> {
    /// Rows `rows` of the plan `plan` over the documents stored as `stored`, into `out`
    /// (padding written first when the plan pads).
    #[allow(clippy::too_many_arguments, reason = "a packed view's arguments")]
    pub(crate) fn plan(
        store: Arc<zrecord::Store>,
        plan: PlanView<'_>,
        stored: StoredView<'_>,
        rows: &[u64],
        seq_len: u64,
        eos: Option<u64>,
        itemsize: usize,
        out: Out<'b>,
    ) -> zrecord::Result<Self> {
        let mut parts: Vec<Part> = Vec::with_capacity(rows.len() * 4);
        plan.parts(rows, seq_len, eos.is_some(), &mut parts)?;
        let windows = stored.windows(&parts, itemsize)?;
        if let Some(pad) = plan.pad() {
            packing::fill_padding(pad, itemsize, out.dst, out.seg, out.pos);
        }
        Ok(Share { store, parts, windows, eos, out })
    }
}

/// Reads every share's windows in one parallel job, then writes their end tokens, segment ids
/// and positions.
pub(crate) fn read(
    shares: &mut [Share<'_>],
    itemsize: usize,
    shards: usize,
) -> zrecord::Result<()> {
    let mut reads: Vec<StoreParts<'_>> = shares
        .iter_mut()
        .map(|s| StoreParts {
            store: &s.store,
            indices: &s.windows.records,
            starts: &s.windows.starts,
            lens: &s.windows.lens,
            dst: &mut *s.out.dst,
            dst_offsets: &s.windows.offsets,
        })
        .collect();
    zrecord::gather_parts_across(&mut reads, shards)?;
    drop(reads);
    for s in shares {
        if let Some(eos) = s.eos {
            packing::write_end_tokens(&s.parts, eos, itemsize, s.out.dst);
        }
        packing::fill_segments(&s.parts, s.out.seg, s.out.pos);
    }
    Ok(())
}

/// One packed view's batch: rows `rows` of `plan` into the outputs, with the GIL released.
#[allow(clippy::too_many_arguments, reason = "one batch of a packed view, as Python holds it")]
fn one_view(
    py: Python<'_>,
    store: &Bound<'_, Zrecord>,
    plan: &Plan,
    rows: &PyBuffer<u64>,
    seq_len: u64,
    eos: Option<u64>,
    itemsize: usize,
    outs: (&PyBuffer<u8>, &PyBuffer<i32>, &PyBuffer<i32>),
    shards: Option<usize>,
    layout: StoredAs<'_>,
) -> PyResult<()> {
    if seq_len == 0 {
        return Err(crate::errors::bad_argument("seq_len must be > 0"));
    }
    let store = store.get().handle()?;
    let rows = rows.to_vec(py)?;
    let stored = Stored::get(layout)?;
    let (stored, plan) = (stored.borrow()?, plan.borrow()?);
    let tokens = rows.len() as u64 * seq_len;
    let out = Out::get(tokens, itemsize, outs.0, Some((outs.1, outs.2)))?;
    let shards = shards.unwrap_or(usize::MAX);
    detach(py, move || {
        let share = Share::plan(store, plan, stored, &rows, seq_len, eos, itemsize, out)?;
        read(&mut [share], itemsize, shards)
    })
    .py()
}

/// The rows `rows` of a concatenation plan over `store`'s records (the `k`-th document of the
/// stream is `order[k]`, starting at token `starts[k]`): the documents' windows gathered into
/// `dst` (`rows.len() * seq_len` tokens of `itemsize` bytes), the end token `eos_id` where a
/// document ends, and the segment ids and positions of every token. `layout` is
/// `(first_record, piece_rows, view)`: documents stored in pieces (`piece_rows` > 0 tokens each
/// but the last) start at record `first_record[doc]`; a subset's records are `view[record]` of
/// the store.
#[pyfunction]
#[pyo3(signature = (store, starts, order, rows, seq_len, eos_id, itemsize, dst, segments,
                    positions, max_shards, layout))]
#[allow(clippy::too_many_arguments, reason = "one batch of a packed view, as Python holds it")]
pub fn pack_concat(
    py: Python<'_>,
    store: Bound<'_, Zrecord>,
    starts: PyBuffer<i64>,
    order: &Bound<'_, PyAny>,
    rows: PyBuffer<u64>,
    seq_len: u64,
    eos_id: Option<u64>,
    itemsize: usize,
    dst: PyBuffer<u8>,
    segments: PyBuffer<i32>,
    positions: PyBuffer<i32>,
    max_shards: Option<usize>,
    layout: StoredAs<'_>,
) -> PyResult<()> {
    let plan = Plan::concat(starts, order)?;
    let outs = (&dst, &segments, &positions);
    one_view(py, &store, &plan, &rows, seq_len, eos_id, itemsize, outs, max_shards, layout)
}

/// The rows `rows` of a first-fit plan over `store`'s records (row `r` holds documents
/// `row_docs[row_ptr[r]..row_ptr[r + 1]]`, each taking `sizes[doc]` tokens): the documents
/// from their start, the end token `eos_id` after each that ends in the row, the rest of each
/// row `pad_id` with segment id and position 0, and the segment ids and positions. The layout
/// arguments are those of [`pack_concat`].
#[pyfunction]
#[pyo3(signature = (store, row_ptr, row_docs, sizes, rows, seq_len, eos_id, pad_id, itemsize,
                    dst, segments, positions, max_shards, layout))]
#[allow(clippy::too_many_arguments, reason = "one batch of a packed view, as Python holds it")]
pub fn pack_first_fit(
    py: Python<'_>,
    store: Bound<'_, Zrecord>,
    row_ptr: PyBuffer<i64>,
    row_docs: &Bound<'_, PyAny>,
    sizes: &Bound<'_, PyAny>,
    rows: PyBuffer<u64>,
    seq_len: u64,
    eos_id: Option<u64>,
    pad_id: u64,
    itemsize: usize,
    dst: PyBuffer<u8>,
    segments: PyBuffer<i32>,
    positions: PyBuffer<i32>,
    max_shards: Option<usize>,
    layout: StoredAs<'_>,
) -> PyResult<()> {
    let plan = Plan::first_fit(row_ptr, row_docs, sizes, pad_id)?;
    let outs = (&dst, &segments, &positions);
    one_view(py, &store, &plan, &rows, seq_len, eos_id, itemsize, outs, max_shards, layout)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pack_concat, m)?)?;
    m.add_function(wrap_pyfunction!(pack_first_fit, m)?)
}
