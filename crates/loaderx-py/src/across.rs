//! Reads over several stores in one call (`zrecord::across`), for a concatenation of stores:
//! an `Across` holds the stores and where each one starts in the concatenation, converted once,
//! so a batch crosses the binding once with its global indices, and the engine locates,
//! groups and reads them with the GIL released.

use std::sync::Arc;

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use zrecord::across::Starts;
use zrecord::Store;

use crate::buffers::{check_lengths_out, slice_mut};
use crate::errors::IntoPyResult;
use crate::exit::detach;
use crate::store::Zrecord;

/// Stores read as one index space: store `k` holds records `starts[k]..starts[k + 1]`.
///
/// The stores are kept as their Python handles, and each call takes their engine handles
/// afresh, so a store closed after the `Across` was made is reported as closed, not read.
#[pyclass(name = "Across", module = "loaderx._native", frozen)]
pub struct Across {
    stores: Vec<Py<Zrecord>>,
    starts: Starts,
}

impl Across {
    fn handles(&self) -> PyResult<Vec<Arc<Store>>> {
        self.stores.iter().map(|s| s.get().handle()).collect()
    }
}

fn refs(handles: &[Arc<Store>]) -> Vec<&Store> {
    handles.iter().map(AsRef::as_ref).collect()
}

#[pymethods]
impl Across {
    #[new]
    fn new(py: Python<'_>, stores: Vec<Py<Zrecord>>, starts: PyBuffer<u64>) -> PyResult<Self> {
        let starts = Starts::new(stores.len(), starts.to_vec(py)?).py()?;
        Ok(Across { stores, starts })
    }

    /// Record `idxs[i]` into row `i` of `dst` (rows of `record_len` bytes), or row `rows[i]`
    /// when given (strictly increasing), each store's read split into at most `max_shards`
    /// parallel blocks.
    #[pyo3(signature = (idxs, dst, record_len, max_shards=None, rows=None))]
    fn gather_fixed(
        &self,
        py: Python<'_>,
        idxs: PyBuffer<u64>,
        dst: PyBuffer<u8>,
        record_len: usize,
        max_shards: Option<usize>,
        rows: Option<PyBuffer<u64>>,
    ) -> PyResult<()> {
        let handles = self.handles()?;
        let idxs = idxs.to_vec(py)?;
        let rows = rows.map(|r| r.to_vec(py)).transpose()?;
        let dst = slice_mut(&dst, "destination")?;
        let shards = max_shards.unwrap_or(usize::MAX);
        detach(py, || {
            zrecord::across::gather_fixed_across(
                &refs(&handles),
                &self.starts,
                &idxs,
                rows.as_deref(),
                dst,
                record_len,
                shards,
            )
        })
        .py()
    }

    /// Record `idxs[i]` into `dst` at byte `offsets[i]`.
    fn gather(
        &self,
        py: Python<'_>,
        idxs: PyBuffer<u64>,
        dst: PyBuffer<u8>,
        offsets: PyBuffer<u64>,
    ) -> PyResult<()> {
        let handles = self.handles()?;
        let idxs = idxs.to_vec(py)?;
        let offsets = offsets.to_vec(py)?;
        let dst = slice_mut(&dst, "destination")?;
        detach(py, || {
            zrecord::across::gather_across(&refs(&handles), &self.starts, &idxs, dst, &offsets)
        })
        .py()
    }

    /// The logical byte length of record `idxs[i]`, into `out` (uint32).
    fn lengths(&self, py: Python<'_>, idxs: PyBuffer<u64>, out: PyBuffer<u32>) -> PyResult<()> {
        let handles = self.handles()?;
        let idxs = idxs.to_vec(py)?;
        check_lengths_out(&out, idxs.len())?;
        let lens =
            detach(py, || zrecord::across::lengths_across(&refs(&handles), &self.starts, &idxs))
                .py()?;
        out.copy_from_slice(py, &lens)
    }

    /// The number of records of the concatenation.
    fn __len__(&self) -> usize {
        // Bounded by the stores' record limits (2^24 each, at most a few hundred thousand
        // stores), far below usize on the 64-bit targets this builds for.
        usize::try_from(self.starts.total()).unwrap_or(usize::MAX)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Across>()
}
