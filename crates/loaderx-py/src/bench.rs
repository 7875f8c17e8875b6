//! Benchmark ceilings, built only with the `bench` feature (the development environment of
//! `scripts/env.sh`; never in the default wheel): the same copy and the same reads a gather
//! does, without the store, for `scripts/bench_store.py` and `scripts/bench_cold.py` to
//! measure gathers against; the engine's per-stage write clocks for `scripts/bench_write.py`;
//! and, for `scripts/bench_mix.py`, a mixture's per-batch resolution timed without crossing
//! the binding, beside a shuffled store's sampler batch (what it stands in for).

use pyo3::prelude::*;

use crate::{buffers, errors, exit};

/// Benchmark ceiling: copies fixed-size records at `idxs` from an in-memory `src` into `dst`
/// on the same pool and with the same sharding as a gather.
#[pyfunction]
fn copy_records(
    py: Python<'_>,
    src: pyo3::buffer::PyBuffer<u8>,
    record: usize,
    idxs: pyo3::buffer::PyBuffer<u64>,
    dst: pyo3::buffer::PyBuffer<u8>,
) -> PyResult<()> {
    let idxs = idxs.to_vec(py)?;
    if src.is_c_contiguous() && dst.is_c_contiguous() && buffers::overlap(&src, &dst) {
        return Err(errors::bad_argument(
            "src and destination share memory; copy_records needs separate buffers",
        ));
    }
    let src = buffers::slice(&src, "src")?;
    let dst = buffers::slice_mut(&dst, "destination")?;
    let fits = idxs.iter().all(|&i| {
        i.checked_add(1)
            .and_then(|n| n.checked_mul(record as u64))
            .is_some_and(|end| end <= src.len() as u64)
    });
    if !fits || dst.len() < idxs.len() * record {
        return Err(errors::bad_argument("index or destination out of range"));
    }
    exit::detach(py, || zrecord::ceiling::copy_records(src, record, &idxs, dst));
    Ok(())
}

/// Benchmark ceiling for cold reads: `record` bytes at each of `offsets` of the file at `path`
/// into `dst`, with plain `pread`s on `threads` threads.
#[pyfunction]
fn pread_records(
    py: Python<'_>,
    path: std::path::PathBuf,
    offsets: pyo3::buffer::PyBuffer<u64>,
    record: usize,
    dst: pyo3::buffer::PyBuffer<u8>,
    threads: usize,
) -> PyResult<()> {
    let offsets = offsets.to_vec(py)?;
    let dst = buffers::slice_mut(&dst, "destination")?;
    if dst.len() < offsets.len().saturating_mul(record) {
        return Err(errors::bad_argument("destination too small"));
    }
    exit::detach(py, || zrecord::ceiling::pread_records(&path, &offsets, record, dst, threads))
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
}

/// The engine's per-stage clocks of appends and syncs since the last reset, as
/// `{stage: (seconds, calls)}` (thread-seconds for the stages that run on several threads;
/// see `zrecord::profile`); `reset=True` zeroes them after reading.
#[pyfunction]
#[pyo3(signature = (reset = false))]
fn write_profile(reset: bool) -> std::collections::HashMap<&'static str, (f64, u64)> {
    zrecord::profile::snapshot(reset).into_iter().map(|(name, s, n)| (name, (s, n))).collect()
}

/// Adds the ceilings to the native module.
/// Seconds per call of `batch(b)` for `b` in `0..batches`, timed with the GIL released.
fn seconds_per_batch<E: Send>(
    py: Python<'_>,
    batches: u64,
    mut batch: impl FnMut(u64) -> Result<(), E> + Send,
) -> Result<f64, E> {
    let t = std::time::Instant::now();
    exit::detach(py, move || (0..batches).try_for_each(&mut batch))?;
    Ok(t.elapsed().as_secs_f64() / batches.max(1) as f64)
}

/// Seconds per batch to resolve `batches` consecutive runs of `n` positions of a mixture from
/// position `first` on (each source's counts and draws: what a mixture's batch call does before
/// it reads), timed in the engine.
#[pyfunction]
fn mixed_run_seconds(
    py: Python<'_>,
    run: &crate::sampler::MixedRun,
    first: u64,
    n: usize,
    batches: u64,
) -> PyResult<f64> {
    let core = &run.core;
    let k = core.sources();
    let (mut records, mut starts, mut takes) = (vec![0u64; n], vec![0u64; k], vec![0u64; k]);
    seconds_per_batch(py, batches, |b| {
        core.run(first + b * n as u64, &mut records, &mut starts, &mut takes)?;
        std::hint::black_box(&records);
        Ok(())
    })
    .map_err(errors::sampler_to_py)
}

/// Seconds per batch of `n` indices of a store of `length` records in the shuffled (`cyclic`)
/// order, timed in the engine: the order a mixture's draws replace.
#[pyfunction]
fn shuffled_batch_seconds(py: Python<'_>, length: u64, n: u64, batches: u64) -> PyResult<f64> {
    let sampler = zsampler::Sampler::new(length, n, zsampler::Mode::Cyclic, 42)
        .map_err(errors::sampler_to_py)?;
    let mut out = vec![0u64; usize::try_from(n).unwrap_or(usize::MAX)];
    seconds_per_batch(py, batches, |step| {
        sampler.fill(step, &mut out)?;
        std::hint::black_box(&out);
        Ok(())
    })
    .map_err(errors::sampler_to_py)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mixed_run_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(shuffled_batch_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(copy_records, m)?)?;
    m.add_function(wrap_pyfunction!(write_profile, m)?)?;
    m.add_function(wrap_pyfunction!(pread_records, m)?)
}
