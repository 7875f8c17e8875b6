//! Reads over several stores in one call (`zrecord::across`), for a concatenation of stores:
//! the batch's part numbers and indices in, one crossing of the binding, the GIL released
//! around every store's read.

use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use zrecord::Store;

use crate::buffers::slice_mut;
use crate::errors::IntoPyResult;
use crate::exit::detach;
use crate::store::Zrecord;

/// The engine handles of `stores` (each open).
fn handles(stores: &[Bound<'_, Zrecord>]) -> PyResult<Vec<Arc<Store>>> {
    stores.iter().map(|s| s.get().handle()).collect()
}

/// Record `idxs[i]` of store `parts[i]` into row `i` of `dst` (rows of `record_len` bytes), or
/// row `rows[i]` when given (strictly increasing), each store's read split into at most
/// `max_shards` parallel blocks.
#[pyfunction]
#[pyo3(signature = (stores, parts, idxs, dst, record_len, max_shards=None, rows=None))]
#[allow(clippy::too_many_arguments, reason = "one batch of a concatenation, as Python holds it")]
pub fn gather_fixed_across(
    py: Python<'_>,
    stores: Vec<Bound<'_, Zrecord>>,
    parts: PyBuffer<u32>,
    idxs: PyBuffer<u64>,
    dst: PyBuffer<u8>,
    record_len: usize,
    max_shards: Option<usize>,
    rows: Option<PyBuffer<u64>>,
) -> PyResult<()> {
    let handles = handles(&stores)?;
    let (parts, idxs) = (parts.to_vec(py)?, idxs.to_vec(py)?);
    let rows = rows.map(|r| r.to_vec(py)).transpose()?;
    let dst = slice_mut(&dst, "destination")?;
    let shards = max_shards.unwrap_or(usize::MAX);
    detach(py, || {
        let refs: Vec<&Store> = handles.iter().map(AsRef::as_ref).collect();
        let rows = rows.as_deref();
        zrecord::across::gather_fixed_across(&refs, &parts, &idxs, rows, dst, record_len, shards)
    })
    .py()
}

/// Record `idxs[i]` of store `parts[i]` into `dst` at byte `offsets[i]`.
#[pyfunction]
pub fn gather_across(
    py: Python<'_>,
    stores: Vec<Bound<'_, Zrecord>>,
    parts: PyBuffer<u32>,
    idxs: PyBuffer<u64>,
    dst: PyBuffer<u8>,
    offsets: PyBuffer<u64>,
) -> PyResult<()> {
    let handles = handles(&stores)?;
    let (parts, idxs, offsets) = (parts.to_vec(py)?, idxs.to_vec(py)?, offsets.to_vec(py)?);
    let dst = slice_mut(&dst, "destination")?;
    detach(py, || {
        let refs: Vec<&Store> = handles.iter().map(AsRef::as_ref).collect();
        zrecord::across::gather_across(&refs, &parts, &idxs, dst, &offsets)
    })
    .py()
}

/// The logical byte length of record `idxs[i]` of store `parts[i]`, into `out` (uint32).
#[pyfunction]
pub fn lengths_across(
    py: Python<'_>,
    stores: Vec<Bound<'_, Zrecord>>,
    parts: PyBuffer<u32>,
    idxs: PyBuffer<u64>,
    out: PyBuffer<u32>,
) -> PyResult<()> {
    let handles = handles(&stores)?;
    let (parts, idxs) = (parts.to_vec(py)?, idxs.to_vec(py)?);
    if out.item_count() != idxs.len() || out.readonly() || !out.is_c_contiguous() {
        return Err(crate::errors::bad_argument(
            "out must be a writable uint32 array of len(idxs)",
        ));
    }
    let lens = detach(py, || {
        let refs: Vec<&Store> = handles.iter().map(AsRef::as_ref).collect();
        zrecord::across::lengths_across(&refs, &parts, &idxs)
    })
    .py()?;
    out.copy_from_slice(py, &lens)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gather_fixed_across, m)?)?;
    m.add_function(wrap_pyfunction!(gather_across, m)?)?;
    m.add_function(wrap_pyfunction!(lengths_across, m)?)
}
