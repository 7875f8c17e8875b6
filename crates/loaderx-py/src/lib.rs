//! `loaderx._native`: the compiled half of the loaderx package. It only converts arguments,
//! releases the GIL around engine calls and maps errors; the engines are `zrecord` and
//! `zsampler`, the user-facing API is the Python package.

use pyo3::prelude::*;

mod buffers;
mod errors;
mod exit;
mod sampler;
mod store;

/// Sets the number of threads batch operations are split across (0: the default).
#[pyfunction]
fn set_num_threads(n: usize) {
    zrecord::pool::set_num_threads(n);
}

/// Number of threads batch operations are split across.
#[pyfunction]
fn num_threads() -> usize {
    zrecord::pool::num_threads()
}

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
        return Err(pyo3::exceptions::PyValueError::new_err(
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
        return Err(pyo3::exceptions::PyValueError::new_err("index or destination out of range"));
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
        return Err(pyo3::exceptions::PyValueError::new_err("destination too small"));
    }
    exit::detach(py, || zrecord::ceiling::pread_records(&path, &offsets, record, dst, threads))
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))
}

#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::PyStore>()?;
    sampler::register(m)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(copy_records, m)?)?;
    m.add_function(wrap_pyfunction!(exit::begin_exit, m)?)?;
    m.add_function(wrap_pyfunction!(pread_records, m)?)?;
    m.add("FORMAT_VERSION", zrecord::format::VERSION)?;
    m.add("MAX_RECORDS", zrecord::format::MAX_RECORDS)?;
    m.add("MAX_RECORD_BYTES", zrecord::format::MAX_RECORD_BYTES)?;
    Ok(())
}
