//! Reads over several stores in one call (`zrecord::across`), for a concatenation of stores:
//! the batch's part numbers and indices in, one crossing of the binding, the GIL released
//! around every store's read.

use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use zrecord::Store;

use crate::buffers::{check_lengths_out, slice_mut};
use crate::errors::IntoPyResult;
use crate::exit::detach;
use crate::store::Zrecord;

/// A batch over several stores, converted: each store's engine handle (each open), and the
/// part number and index of every record.
struct Batch {
    handles: Vec<Arc<Store>>,
    parts: Vec<u32>,
    idxs: Vec<u64>,
}

impl Batch {
    fn new(
        py: Python<'_>,
        stores: &[Bound<'_, Zrecord>],
        parts: &PyBuffer<u32>,
        idxs: &PyBuffer<u64>,
    ) -> PyResult<Self> {
        let handles = stores.iter().map(|s| s.get().handle()).collect::<PyResult<_>>()?;
        Ok(Batch { handles, parts: parts.to_vec(py)?, idxs: idxs.to_vec(py)? })
    }

    fn stores(&self) -> Vec<&Store> {
        self.handles.iter().map(AsRef::as_ref).collect()
    }
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
    let b = Batch::new(py, &stores, &parts, &idxs)?;
    let rows = rows.map(|r| r.to_vec(py)).transpose()?;
    let dst = slice_mut(&dst, "destination")?;
    let shards = max_shards.unwrap_or(usize::MAX);
    detach(py, || {
        let rows = rows.as_deref();
        zrecord::across::gather_fixed_across(
            &b.stores(),
            &b.parts,
            &b.idxs,
            rows,
            dst,
            record_len,
            shards,
        )
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
    let b = Batch::new(py, &stores, &parts, &idxs)?;
    let offsets = offsets.to_vec(py)?;
    let dst = slice_mut(&dst, "destination")?;
    detach(py, || zrecord::across::gather_across(&b.stores(), &b.parts, &b.idxs, dst, &offsets))
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
    let b = Batch::new(py, &stores, &parts, &idxs)?;
    check_lengths_out(&out, b.idxs.len())?;
    let lens =
        detach(py, || zrecord::across::lengths_across(&b.stores(), &b.parts, &b.idxs)).py()?;
    out.copy_from_slice(py, &lens)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gather_fixed_across, m)?)?;
    m.add_function(wrap_pyfunction!(gather_across, m)?)?;
    m.add_function(wrap_pyfunction!(lengths_across, m)?)
}
