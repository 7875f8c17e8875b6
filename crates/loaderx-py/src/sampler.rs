//! `loaderx._native.Sampler`, `MixedRun` and `mix_draws`: the `PyO3` face of the `zsampler` crate.
//!
//! Conversion, error mapping and buffer handling only; every index comes from `zsampler`. A batch
//! is written straight into a caller-supplied, writable, C-contiguous uint64 buffer (a `NumPy` array
//! from `np.empty`), one native call per batch.
//!
//! Thread safety: the class is frozen and its only mutable state, the step, is an `AtomicU64`.
//! `next_into` claims its step with one `fetch_add`, so threads sharing a sampler each get a
//! distinct step and the batch for it; a batch is a pure function of its step, so nothing else
//! needs a lock.
//!
//! The interpreter is detached only for batches of at least [`DETACH_AT`] indices. Below that a
//! batch is a few microseconds of work, less than what handing the GIL to a busy Python thread
//! and waiting to get it back can cost on a GIL build.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use zsampler::draws::SourceOrder;
use zsampler::{Mode, Sampler as Core};

use crate::buffers::{slice, slice_mut};

/// From this many indices per batch the work is done detached from the interpreter.
const DETACH_AT: u64 = 1 << 16;

/// The batch index generator. See `loaderx.sampler.Sampler` for the public API.
#[pyclass(name = "Sampler", module = "loaderx._native", frozen)]
pub struct Sampler {
    core: Core,
    step: AtomicU64,
}

impl Sampler {
    /// `out` as a uint64 buffer of `batch_size` items, or a `ValueError` saying why not.
    fn batch_buffer(&self, out: &Bound<'_, PyAny>) -> PyResult<PyBuffer<u64>> {
        let buf = PyBuffer::<u64>::get(out).map_err(|err| {
            crate::errors::bad_argument(format!(
                "out must be a uint64 buffer (a NumPy uint64 array): {err}"
            ))
        })?;
        let got = buf.item_count() as u64;
        if got != self.core.batch_size() {
            return Err(crate::errors::bad_argument(format!(
                "out holds {got} items, expected batch_size = {}",
                self.core.batch_size()
            )));
        }
        Ok(buf)
    }

    /// Write batch `step` into `out`, which holds `batch_size` items.
    fn write(&self, py: Python<'_>, step: u64, out: &mut [u64]) -> PyResult<()> {
        let result = if self.core.batch_size() >= DETACH_AT {
            let core = &self.core;
            crate::exit::detach(py, || core.fill(step, out))
        } else {
            self.core.fill(step, out)
        };
        result.map_err(crate::errors::sampler_to_py)
    }
}

#[pymethods]
impl Sampler {
    /// `Sampler(length, batch_size, mode, seed)`: mode 0 sequential, 1 iid, 2 cyclic; the seed is
    /// an unsigned 64-bit integer (the Python wrapper maps any integer onto it).
    #[new]
    fn new(length: u64, batch_size: u64, mode: u8, seed: u64) -> PyResult<Self> {
        let mode = Mode::try_from(mode).map_err(crate::errors::sampler_to_py)?;
        let core =
            Core::new(length, batch_size, mode, seed).map_err(crate::errors::sampler_to_py)?;
        Ok(Self { core, step: AtomicU64::new(0) })
    }

    /// Write batch `step` into `out` without moving the sampler.
    fn fill(&self, py: Python<'_>, step: u64, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let buf = self.batch_buffer(out)?;
        self.write(py, step, slice_mut(&buf, "out")?)
    }

    /// Write the batch at the current step into `out`, advance, and return the step written.
    fn next_into(&self, py: Python<'_>, out: &Bound<'_, PyAny>) -> PyResult<u64> {
        let buf = self.batch_buffer(out)?;
        let out = slice_mut(&buf, "out")?;
        // Claimed only once the buffer is known good: a rejected buffer consumes no step.
        let step = self.step.fetch_add(1, Ordering::Relaxed);
        self.write(py, step, out)?;
        Ok(step)
    }

    /// Make `step` the next batch `next_into` writes.
    fn seek(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    /// The step of the next batch `next_into` writes.
    #[getter]
    fn step(&self) -> u64 {
        self.step.load(Ordering::Relaxed)
    }

    #[getter]
    fn length(&self) -> u64 {
        self.core.length()
    }

    #[getter]
    fn batch_size(&self) -> u64 {
        self.core.batch_size()
    }

    /// The mode number: 0 sequential, 1 iid, 2 cyclic.
    #[getter]
    fn mode(&self) -> u8 {
        self.core.mode() as u8
    }

    /// The unsigned 64-bit seed the generator is keyed with.
    #[getter]
    fn seed(&self) -> u64 {
        self.core.seed()
    }

    fn __repr__(&self) -> String {
        format!(
            "_native.Sampler(length={}, batch_size={}, mode={}, seed={}, step={})",
            self.core.length(),
            self.core.batch_size(),
            self.core.mode() as u8,
            self.core.seed(),
            self.step()
        )
    }
}

/// `mix_draws(out, first, length, a, b, base)`: the records of a mixture source's draws
/// `first, first + 1, ...` into the uint64 buffer `out` (see `zsampler::draws`).
#[pyfunction]
fn mix_draws(
    py: Python<'_>,
    out: &Bound<'_, PyAny>,
    first: u64,
    length: u64,
    a: u64,
    b: u64,
    base: u64,
) -> PyResult<()> {
    let order = SourceOrder::new(length, a, b, base).map_err(crate::errors::sampler_to_py)?;
    let buf = PyBuffer::<u64>::get(out)
        .map_err(|_| crate::errors::bad_argument("out must be a uint64 buffer"))?;
    let out = slice_mut(&buf, "out")?;
    let result = if out.len() as u64 >= DETACH_AT {
        crate::exit::detach(py, || order.draws_into(first, out))
    } else {
        order.draws_into(first, out)
    };
    result.map_err(crate::errors::sampler_to_py)
}

/// A mixture's batch bookkeeping: one period of its mixed order and its sources'
/// permutations (see `zsampler::mixture`). Immutable: threads share it.
/// A mixed order from Python's arguments: `table` the uint16 source of each position of a
/// period, `orders` each source's `(length, a, b, base)` (see `mix_draws`).
pub(crate) fn mixed_run(
    table: &PyBuffer<u16>,
    orders: Vec<(u64, u64, u64, u64)>,
) -> PyResult<zsampler::mixture::MixedRun> {
    let src = slice(table, "table")?.to_vec();
    let orders = orders
        .into_iter()
        .map(|(n, a, b, base)| SourceOrder::new(n, a, b, base))
        .collect::<Result<Vec<_>, _>>()
        .map_err(crate::errors::sampler_to_py)?;
    zsampler::mixture::MixedRun::new(src, orders).map_err(crate::errors::sampler_to_py)
}

#[pyclass(name = "MixedRun", module = "loaderx._native", frozen)]
pub struct MixedRun {
    pub(crate) core: zsampler::mixture::MixedRun,
}

#[pymethods]
impl MixedRun {
    /// `MixedRun(table, orders)`: `table` the uint16 source of each position of a period,
    /// `orders` each source's `(length, a, b, base)` (see `mix_draws`).
    #[new]
    fn new(table: PyBuffer<u16>, orders: Vec<(u64, u64, u64, u64)>) -> PyResult<Self> {
        Ok(Self { core: mixed_run(&table, orders)? })
    }

    /// `run(first, records)`: positions `first, first + 1, ...` (one per entry of the uint64
    /// buffer `records`): each source's draws before them and in them, as two lists, and the
    /// records of those draws into `records`, grouped by source.
    fn run(
        &self,
        py: Python<'_>,
        first: u64,
        records: &Bound<'_, PyAny>,
    ) -> PyResult<(Vec<u64>, Vec<u64>)> {
        let buf = PyBuffer::<u64>::get(records)
            .map_err(|_| crate::errors::bad_argument("records must be a uint64 buffer"))?;
        let out = slice_mut(&buf, "records")?;
        let k = self.core.sources();
        let (mut starts, mut takes) = (vec![0u64; k], vec![0u64; k]);
        let result = if out.len() as u64 >= DETACH_AT {
            crate::exit::detach(py, || self.core.run(first, out, &mut starts, &mut takes))
        } else {
            self.core.run(first, out, &mut starts, &mut takes)
        };
        result.map_err(crate::errors::sampler_to_py)?;
        Ok((starts, takes))
    }
}

/// Add `Sampler`, `MixedRun` and `mix_draws` to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Sampler>()?;
    m.add_class::<MixedRun>()?;
    m.add_function(wrap_pyfunction!(mix_draws, m)?)
}
