//! `loaderx._native`: the compiled half of the loaderx package. It only converts arguments,
//! releases the GIL around engine calls and maps errors; the engines are `zrecord` and
//! `zsampler`, the user-facing API is the Python package.

// The binding's only `unsafe` is in buffers.rs, which says why.
#![deny(unsafe_code)]
#![allow(
    clippy::needless_pass_by_value,
    reason = "pyo3 hands #[pyfunction] arguments over by value, and map_err callbacks take the \
              error by value"
)]

use pyo3::prelude::*;

mod across;
#[cfg(feature = "bench")]
mod bench;
mod buffers;
mod errors;
mod exit;
mod mixed;
mod packed;
mod sampler;
mod store;
#[cfg(feature = "testing")]
mod testing;

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

/// Replaces `dir/name` with `data` durably and atomically (temporary file, sync, rename, sync
/// of the directory), through the engine's one durable-write routine.
#[pyfunction]
fn replace_file(py: Python<'_>, dir: std::path::PathBuf, name: &str, data: &[u8]) -> PyResult<()> {
    exit::detach(py, || zrecord::disk::replace_file(&dir, name, data)).map_err(errors::to_py)
}

/// Renames `src` to `dst` unless `dst` exists; returns whether it renamed.
#[pyfunction]
fn rename_noreplace(
    py: Python<'_>,
    src: std::path::PathBuf,
    dst: std::path::PathBuf,
) -> PyResult<bool> {
    exit::detach(py, || zrecord::disk::rename_noreplace(&src, &dst)).map_err(errors::to_py)
}

/// Swaps the names `a` and `b` atomically (both must exist; `OSError` with `EINVAL` where the
/// filesystem cannot).
#[pyfunction]
fn rename_exchange(py: Python<'_>, a: std::path::PathBuf, b: std::path::PathBuf) -> PyResult<()> {
    exit::detach(py, || zrecord::disk::rename_exchange(&a, &b)).map_err(errors::to_py)
}

/// The canonical name of the codec `name` (`zstdict` is the reference's spelling of
/// `zstd_dict`), or `LoaderxValueError` naming the codecs there are.
#[pyfunction]
fn canonical_codec(name: &Bound<'_, PyAny>) -> PyResult<&'static str> {
    name.extract::<&str>()
        .ok()
        .and_then(zrecord::Codec::from_name)
        .map(zrecord::Codec::name)
        .ok_or_else(|| {
            let names: Vec<&str> = zrecord::Codec::ALL.iter().map(|c| c.name()).collect();
            errors::bad_argument(format!(
                "unknown codec {}: expected one of {}",
                name.repr().map_or_else(|_| "?".to_owned(), |r| r.to_string()),
                names.join(", ")
            ))
        })
}

#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Zrecord>()?;
    sampler::register(m)?;
    across::register(m)?;
    packed::register(m)?;
    mixed::register(m)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_codec, m)?)?;
    m.add_function(wrap_pyfunction!(replace_file, m)?)?;
    m.add_function(wrap_pyfunction!(rename_noreplace, m)?)?;
    m.add_function(wrap_pyfunction!(rename_exchange, m)?)?;
    m.add_function(wrap_pyfunction!(exit::begin_exit, m)?)?;
    #[cfg(feature = "bench")]
    bench::register(m)?;
    #[cfg(feature = "testing")]
    testing::register(m)?;
    let codecs: Vec<&str> = zrecord::Codec::ALL.iter().map(|c| c.name()).collect();
    m.add("CODECS", pyo3::types::PyTuple::new(m.py(), codecs)?)?;
    m.add("FORMAT_VERSION", zrecord::format::VERSION)?;
    m.add("MAX_RECORDS", zrecord::format::MAX_RECORDS)?;
    m.add("MAX_RECORD_BYTES", zrecord::format::MAX_RECORD_BYTES)?;
    Ok(())
}
