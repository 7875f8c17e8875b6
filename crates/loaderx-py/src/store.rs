//! `loaderx._native.Zrecord`: the store handle. Arguments arrive as buffers already checked and
//! converted by `loaderx/zrecord.py` (except for `try_gather`, which takes the usual arrays as
//! they are and declines anything else); this file converts them to slices, releases the GIL
//! around every engine call and maps errors.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use zrecord::{Codec, Options, Store};

use crate::buffers::{check_lengths_out, slice, slice_mut, u64_values, writable_bytes};
use crate::errors::IntoPyResult;
use crate::exit::detach;

fn codec(name: &str) -> PyResult<Codec> {
    Codec::from_name(name).ok_or_else(|| {
        crate::errors::bad_argument(format!(
            "unknown codec {name:?}: expected one of 'raw', 'zstd', 'zstd_dict'"
        ))
    })
}

/// A zrecord store handle. Holds no lock of its own (a process forked while another thread was
/// inside a call must still be able to use it): the engine's handle sits behind an atomic
/// pointer. Each call takes a reference to it for its duration, and closing takes it away, so
/// the maps and files go as soon as the calls in flight have finished, not when the Python
/// object is collected.
#[pyclass(name = "Zrecord", module = "loaderx._native", frozen)]
pub struct Zrecord {
    store: ArcSwapOption<Store>,
    path: String,
}

impl Zrecord {
    fn get(&self) -> PyResult<Arc<Store>> {
        self.store.load_full().ok_or_else(crate::errors::closed)
    }

    /// The engine's handle, for calls over several stores (`across.rs`).
    pub(crate) fn handle(&self) -> PyResult<Arc<Store>> {
        self.get()
    }
}

#[pymethods]
impl Zrecord {
    #[new]
    #[pyo3(signature = (path, codec_name = "zstd", chunk_capacity = None))]
    fn new(
        py: Python<'_>,
        path: String,
        codec_name: &str,
        chunk_capacity: Option<u64>,
    ) -> PyResult<Self> {
        let mut options = Options { codec: codec(codec_name)?, ..Options::default() };
        if let Some(c) = chunk_capacity {
            options.chunk_capacity = c;
        }
        let p = path.clone();
        let store = detach(py, move || Store::open(p, options)).py()?;
        Ok(Zrecord { store: ArcSwapOption::from_pointee(store), path })
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    #[getter]
    fn codec(&self) -> PyResult<&'static str> {
        Ok(self.get()?.default_codec().name())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.store.load().is_none()
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.get()?.len() as usize)
    }

    #[pyo3(signature = (src, offsets, codec_name = None))]
    fn append(
        &self,
        py: Python<'_>,
        src: PyBuffer<u8>,
        offsets: PyBuffer<u64>,
        codec_name: Option<&str>,
    ) -> PyResult<u64> {
        let store = self.get()?;
        let codec = codec_name.map(codec).transpose()?;
        let offsets = offsets.to_vec(py)?;
        let src = slice(&src, "src")?;
        detach(py, || store.append(src, &offsets, codec)).py()
    }

    fn gather(
        &self,
        py: Python<'_>,
        idxs: PyBuffer<u64>,
        dst: PyBuffer<u8>,
        offsets: PyBuffer<u64>,
    ) -> PyResult<()> {
        let store = self.get()?;
        let idxs = idxs.to_vec(py)?;
        let offsets = offsets.to_vec(py)?;
        let dst = slice_mut(&dst, "destination")?;
        detach(py, || store.gather(&idxs, dst, &offsets)).py()
    }

    /// `gather` for arguments usable as they are: indices and offsets as uint64 or non-negative
    /// int64 arrays, `dst` a writable C-contiguous uint8 buffer. Returns False, having done
    /// nothing, for any other arguments; the caller converts those and calls `gather`. Saves
    /// the Python-side conversions on the hot path (each costs microseconds right after a
    /// batch-sized copy has flushed the caches).
    fn try_gather(
        &self,
        py: Python<'_>,
        idxs: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>,
        offsets: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let (Some(idxs), Some(offsets), Some(dst)) =
            (u64_values(py, idxs), u64_values(py, offsets), writable_bytes(dst))
        else {
            return Ok(false);
        };
        let store = self.get()?;
        let dst = slice_mut(&dst, "destination")?;
        detach(py, || store.gather(&idxs, dst, &offsets)).py()?;
        Ok(true)
    }

    /// Fixed-stride gather: record `idxs[i]` lands at row `i` of `dst` (rows of `record_len`
    /// bytes), or at row `rows[i]` when given (strictly increasing), split into at most
    /// `max_shards` parallel blocks (all pool threads when not given).
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
        let store = self.get()?;
        let idxs = idxs.to_vec(py)?;
        let rows = rows.map(|r| r.to_vec(py)).transpose()?;
        let dst = slice_mut(&dst, "destination")?;
        let shards = max_shards.unwrap_or(usize::MAX);
        detach(py, || store.gather_fixed_at(&idxs, rows.as_deref(), dst, record_len, shards)).py()
    }

    /// Rows of a block store (a dataset directory's column group): row `idxs[i]` into
    /// `dst[i * row_len..][..row_len]`, record `b` holding rows `b * block_rows ..` and `tail`
    /// the rows after the full blocks; every row must be below `rows`, the count of the
    /// caller's commit point.
    #[pyo3(signature = (idxs, dst, block_rows, row_len, rows, tail, max_shards=None))]
    #[allow(clippy::too_many_arguments, reason = "the arrays and layout of one call")]
    fn gather_block_rows(
        &self,
        py: Python<'_>,
        idxs: PyBuffer<u64>,
        dst: PyBuffer<u8>,
        block_rows: u64,
        row_len: usize,
        rows: u64,
        tail: PyBuffer<u8>,
        max_shards: Option<usize>,
    ) -> PyResult<()> {
        let store = self.get()?;
        let idxs = idxs.to_vec(py)?;
        let dst = slice_mut(&dst, "destination")?;
        let tail = slice(&tail, "tail")?;
        let layout = zrecord::BlockLayout { block_rows, row_len, rows };
        let shards = max_shards.unwrap_or(usize::MAX);
        detach(py, || store.gather_block_rows(&idxs, layout, tail, dst, shards)).py()
    }

    /// `(device, inode, deletes seen)`: what identifies the records this handle's indices name
    /// (see `Store::view_token`).
    fn view_token(&self) -> PyResult<(u64, u64, u64)> {
        Ok(self.get()?.view_token())
    }

    /// Keeps records `0..len` and drops the rest, moving nothing and disturbing no other
    /// handle (records past a dataset directory's commit point an interrupted append left).
    fn truncate(&self, py: Python<'_>, len: u64) -> PyResult<()> {
        let store = self.get()?;
        detach(py, || store.truncate(len)).py()
    }

    /// Windows of records: bytes `starts[i] .. starts[i] + lens[i]` of record `idxs[i]` into
    /// `dst` at `offsets[i]` (a compressed record decoded once per call), split into at most
    /// `max_shards` parallel blocks (all pool threads when not given).
    #[pyo3(signature = (idxs, starts, lens, dst, offsets, max_shards=None))]
    #[allow(clippy::too_many_arguments, reason = "the arrays of one call, as Python passes them")]
    fn gather_parts(
        &self,
        py: Python<'_>,
        idxs: PyBuffer<u64>,
        starts: PyBuffer<u64>,
        lens: PyBuffer<u64>,
        dst: PyBuffer<u8>,
        offsets: PyBuffer<u64>,
        max_shards: Option<usize>,
    ) -> PyResult<()> {
        let store = self.get()?;
        let (idxs, starts, lens) = (idxs.to_vec(py)?, starts.to_vec(py)?, lens.to_vec(py)?);
        let offsets = offsets.to_vec(py)?;
        let dst = slice_mut(&dst, "destination")?;
        let shards = max_shards.unwrap_or(usize::MAX);
        detach(py, || store.gather_parts_at_most(&idxs, &starts, &lens, dst, &offsets, shards)).py()
    }

    fn lengths_into(
        &self,
        py: Python<'_>,
        idxs: PyBuffer<u64>,
        out: PyBuffer<u32>,
    ) -> PyResult<()> {
        let store = self.get()?;
        let idxs = idxs.to_vec(py)?;
        check_lengths_out(&out, idxs.len())?;
        let lens = detach(py, || store.lengths(&idxs)).py()?;
        out.copy_from_slice(py, &lens)
    }

    /// Starts reading records into the page cache; returns without waiting, saying whether
    /// anything was asked for.
    fn prefetch(&self, py: Python<'_>, idxs: PyBuffer<u64>) -> PyResult<bool> {
        let store = self.get()?;
        let idxs = idxs.to_vec(py)?;
        detach(py, || store.prefetch(&idxs)).py()
    }

    /// Whether the last gather or prefetch found records that were not in memory.
    #[getter]
    fn recently_cold(&self) -> PyResult<bool> {
        Ok(self.get()?.recently_cold())
    }

    fn delete(&self, py: Python<'_>, idxs: PyBuffer<u64>) -> PyResult<()> {
        let store = self.get()?;
        let idxs = idxs.to_vec(py)?;
        detach(py, || store.delete(&idxs)).py()
    }

    fn compact<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.get()?;
        let r = detach(py, || store.compact()).py()?;
        let d = PyDict::new(py);
        d.set_item("moved", r.moved)?;
        d.set_item("skipped", r.skipped)?;
        d.set_item("chunk_bytes_before", r.chunk_bytes_before)?;
        d.set_item("chunk_bytes_after", r.chunk_bytes_after)?;
        d.set_item("chunks_removed", r.chunks_removed)?;
        Ok(d)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.get()?;
        let s = detach(py, || store.stats()).py()?;
        let d = PyDict::new(py);
        d.set_item("records", s.records)?;
        d.set_item("live_bytes", s.live_bytes)?;
        d.set_item("chunk_bytes", s.chunk_bytes)?;
        d.set_item("reclaimable", s.reclaimable)?;
        d.set_item("logical_bytes", s.logical_bytes)?;
        d.set_item("compressed_records", s.compressed_records)?;
        d.set_item("chunks", s.chunks)?;
        d.set_item("dict_bytes", store.dict_size().unwrap_or(0))?;
        d.set_item("checksums", store.has_checksums())?;
        Ok(d)
    }

    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.get()?;
        detach(py, || store.sync()).py()
    }

    /// Makes this empty store the concatenation of `parts` by linking their chunk files in
    /// (`Store::join_from`); the parts are only read.
    fn join_from(&self, py: Python<'_>, parts: Vec<Bound<'_, Zrecord>>) -> PyResult<()> {
        let store = self.get()?;
        let handles = parts.iter().map(|p| p.get().get()).collect::<PyResult<Vec<_>>>()?;
        detach(py, || {
            let refs: Vec<&Store> = handles.iter().map(AsRef::as_ref).collect();
            store.join_from(&refs)
        })
        .py()
    }

    fn train_dict(
        &self,
        py: Python<'_>,
        samples: PyBuffer<u8>,
        sizes: PyBuffer<u64>,
        target: usize,
    ) -> PyResult<usize> {
        let store = self.get()?;
        let sizes: Vec<usize> = sizes.to_vec(py)?.into_iter().map(|s| s as usize).collect();
        let samples = slice(&samples, "samples")?;
        detach(py, || store.train_dict(samples, &sizes, target)).py()
    }

    fn has_dict(&self) -> PyResult<bool> {
        Ok(self.get()?.has_dict())
    }

    fn has_checksums(&self) -> PyResult<bool> {
        Ok(self.get()?.has_checksums())
    }

    fn enable_checksums(&self, py: Python<'_>) -> PyResult<u64> {
        let store = self.get()?;
        detach(py, || store.enable_checksums()).py()
    }

    #[getter]
    fn verify_reads(&self) -> PyResult<bool> {
        Ok(self.get()?.verify_reads())
    }

    #[setter]
    fn set_verify_reads(&self, on: bool) -> PyResult<()> {
        self.get()?.set_verify_reads(on);
        Ok(())
    }

    #[pyo3(signature = (max_listed = 1000))]
    fn verify<'py>(&self, py: Python<'py>, max_listed: usize) -> PyResult<Bound<'py, PyDict>> {
        let store = self.get()?;
        let r = detach(py, || store.verify(max_listed)).py()?;
        let d = PyDict::new(py);
        d.set_item("records", r.records)?;
        d.set_item("checked", r.checked)?;
        d.set_item("unchecked", r.unchecked)?;
        d.set_item("failed", r.failed)?;
        d.set_item("failures", r.failures)?;
        Ok(d)
    }

    /// Takes the writer lock now (refused at once while another handle or process holds it).
    fn lock_for_writing(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.get()?;
        detach(py, || store.lock_for_writing()).py()
    }

    /// Marks the store replaced for every other handle (takes the writer lock).
    fn retire(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.get()?;
        detach(py, || store.retire()).py()
    }

    /// Accepts the store as other handles left it (after their deletes).
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.get()?;
        detach(py, || store.refresh()).py()
    }

    #[getter]
    fn is_writer(&self) -> PyResult<bool> {
        Ok(self.get()?.is_writer())
    }

    /// Syncs and lets the writer lock go; later calls raise. The maps and files are released
    /// once the calls still in flight have finished. Closing twice is a no-op.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(store) = self.store.swap(None) else {
            return Ok(());
        };
        // The last reference (this one, or that of the last call in flight) unmaps and closes.
        detach(py, move || store.close()).py()
    }
}
