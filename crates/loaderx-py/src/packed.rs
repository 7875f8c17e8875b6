//! `loaderx._native.pack_concat` / `pack_first_fit`: one batch of a packed view in one call.
//! The rows' parts come from the plan (`zsampler::packing`), their windows are gathered from
//! the store (`zrecord`), then the end tokens, the padding, the segment ids and the positions
//! are written, all with the GIL released. The plan's arrays are borrowed, never copied.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use zsampler::packing::{self, Layout, LayoutError, Part};

use crate::buffers::{slice, slice_mut, IndexBuffer, Indices};
use crate::errors::IntoPyResult;
use crate::exit::detach;
use crate::store::Zrecord;

/// Where the documents are stored and what a batch is written into, checked.
struct Target<'b> {
    first: Option<Indices<'b>>,
    piece_rows: u64,
    view: Option<&'b [u64]>,
    itemsize: usize,
    dst: &'b mut [u8],
    seg: &'b mut [i32],
    pos: &'b mut [i32],
}

/// Where a packed view's documents are stored, as Python passes it: `(first_record,
/// piece_rows, view)` (see [`pack_concat`]).
type StoredAs<'py> = (Option<Bound<'py, PyAny>>, u64, Option<PyBuffer<u64>>);

/// The layout's first records, taken as a buffer.
fn first_records(layout: &StoredAs<'_>) -> PyResult<Option<IndexBuffer>> {
    layout.0.as_ref().map(|f| IndexBuffer::get(f, "first_record")).transpose()
}

/// The batch's outputs (`tokens` tokens of `itemsize` bytes, the segment ids and positions)
/// and its documents' layout (`first`: the first records `layout` names, taken as a buffer),
/// checked and borrowed.
fn target<'b>(
    tokens: u64,
    itemsize: usize,
    (first, layout): (Option<&'b IndexBuffer>, &'b StoredAs<'_>),
    dst: &'b PyBuffer<u8>,
    [seg, pos]: [&'b PyBuffer<i32>; 2],
) -> PyResult<Target<'b>> {
    let (piece_rows, view) = (layout.1, layout.2.as_ref());
    let bad = |m: String| crate::errors::bad_argument(m);
    if first.is_none() != (piece_rows == 0) {
        return Err(
            bad("first_record and piece_rows > 0 go together (documents in pieces)".into()),
        );
    }
    if !(1..=8).contains(&itemsize) {
        return Err(bad(format!("itemsize must be 1..8, got {itemsize}")));
    }
    let first = first.map(IndexBuffer::values).transpose()?;
    let view = view.map(|v| slice(v, "view")).transpose()?;
    let dst = slice_mut(dst, "destination")?;
    let seg = slice_mut(seg, "segments")?;
    let pos = slice_mut(pos, "positions")?;
    let n = usize::try_from(tokens).unwrap_or(usize::MAX);
    if dst.len() / itemsize < n || seg.len() < n || pos.len() < n {
        return Err(bad(format!("the outputs must hold {tokens} tokens")));
    }
    let (dst, seg, pos) = (&mut dst[..n * itemsize], &mut seg[..n], &mut pos[..n]);
    Ok(Target { first, piece_rows, view, itemsize, dst, seg, pos })
}

/// Gathers the parts' windows into the target, then writes end tokens and segments.
fn read(
    store: &zrecord::Store,
    parts: &[Part],
    t: Target<'_>,
    eos: Option<u64>,
    shards: usize,
) -> zrecord::Result<()> {
    let first = t.first.map(|f| move |doc: u64| f.try_get(doc));
    let first_dyn: Option<&(dyn Fn(u64) -> Option<u64> + Sync)> =
        first.as_ref().map(|f| f as &(dyn Fn(u64) -> Option<u64> + Sync));
    let layout = Layout { first_record: first_dyn, piece_rows: t.piece_rows, view: t.view };
    let w = packing::windows(parts, layout, t.itemsize as u64).map_err(|e| {
        zrecord::Error::InvalidArgument(match e {
            LayoutError::Document(d) => format!("document {d} is not in the plan"),
            LayoutError::Record(r) => format!("record {r} is outside the view"),
        })
    })?;
    store.gather_parts_at_most(&w.records, &w.starts, &w.lens, t.dst, &w.offsets, shards)?;
    if let Some(eos) = eos {
        packing::write_end_tokens(parts, eos, t.itemsize, t.dst);
    }
    packing::fill_segments(parts, t.seg, t.pos);
    Ok(())
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
    let store = store.get().handle()?;
    let rows = rows.to_vec(py)?;
    let starts = slice(&starts, "starts")?;
    let order = IndexBuffer::get(order, "order")?;
    let (docs, order) = (order.len(), order.values()?);
    let bad = |m: String| crate::errors::bad_argument(m);
    if starts.len() != docs + 1 || seq_len == 0 {
        return Err(bad(format!(
            "a plan of {docs} documents needs {} starts (got {}) and seq_len > 0",
            docs + 1,
            starts.len()
        )));
    }
    let total = starts.last().copied().unwrap_or(0).max(0).cast_unsigned();
    if let Some(&r) = rows.iter().find(|&&r| r >= total / seq_len) {
        return Err(bad(format!("row {r} is past the plan's {} rows", total / seq_len)));
    }
    let first = first_records(&layout)?;
    let tokens = rows.len() as u64 * seq_len;
    let t = target(tokens, itemsize, (first.as_ref(), &layout), &dst, [&segments, &positions])?;
    let shards = max_shards.unwrap_or(usize::MAX);
    detach(py, move || {
        let mut parts: Vec<Part> = Vec::with_capacity(rows.len() * 4);
        packing::concat_parts(
            starts,
            |k| order.get(k),
            seq_len,
            eos_id.is_some(),
            &rows,
            &mut parts,
        );
        read(&store, &parts, t, eos_id, shards)
    })
    .py()
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
    let store = store.get().handle()?;
    let rows = rows.to_vec(py)?;
    let row_ptr = slice(&row_ptr, "row_ptr")?;
    let row_docs = IndexBuffer::get(row_docs, "row_docs")?;
    let row_docs = row_docs.values()?;
    let sizes = IndexBuffer::get(sizes, "sizes")?;
    let sizes = sizes.values()?;
    if seq_len == 0 {
        return Err(crate::errors::bad_argument("seq_len must be > 0"));
    }
    let first = first_records(&layout)?;
    let tokens = rows.len() as u64 * seq_len;
    let t = target(tokens, itemsize, (first.as_ref(), &layout), &dst, [&segments, &positions])?;
    let shards = max_shards.unwrap_or(usize::MAX);
    detach(py, move || {
        let mut parts: Vec<Part> = Vec::with_capacity(rows.len() * 4);
        let doc = |k: usize| row_docs.try_get(k as u64);
        packing::first_fit_parts(
            row_ptr,
            doc,
            |d| sizes.try_get(d),
            seq_len,
            eos_id.is_some(),
            &rows,
            &mut parts,
        )
        .map_err(|row| zrecord::Error::InvalidArgument(format!("row {row} is not in the plan")))?;
        packing::fill_padding(pad_id, t.itemsize, t.dst, t.seg, t.pos);
        read(&store, &parts, t, eos_id, shards)
    })
    .py()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pack_concat, m)?)?;
    m.add_function(wrap_pyfunction!(pack_first_fit, m)?)
}
