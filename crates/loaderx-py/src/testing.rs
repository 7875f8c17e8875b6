//! Test hooks, built only with the `testing` feature (the development environment of
//! `scripts/env.sh`; never in the default wheel). `tests/test_errors.py` uses them to pin the
//! Python class of every engine error variant, including those no Python call can provoke on
//! purpose (an internal zstd failure).

use std::path::PathBuf;

use pyo3::prelude::*;
use zrecord::Error;

/// One engine error of each variant, by variant name. The match in [`variant_name`] has no
/// wildcard, so adding a variant to the engine fails to compile until it is listed here.
fn every_variant() -> Vec<Error> {
    let path = PathBuf::from("/store");
    vec![
        Error::Io { path: path.clone(), source: std::io::Error::from_raw_os_error(ENOENT) },
        Error::Corrupt { path: path.clone(), detail: "bad".into() },
        Error::IndexOutOfRange { index: 5, len: 3 },
        Error::LimitExceeded { what: "record size", limit: 1, requested: 2 },
        Error::Busy("busy".into()),
        Error::Changed("changed".into()),
        Error::MissingDictionary { path },
        Error::InvalidArgument("invalid".into()),
        Error::Internal("internal".into()),
    ]
}

fn variant_name(err: &Error) -> &'static str {
    match err {
        Error::Io { .. } => "Io",
        Error::Corrupt { .. } => "Corrupt",
        Error::IndexOutOfRange { .. } => "IndexOutOfRange",
        Error::LimitExceeded { .. } => "LimitExceeded",
        Error::Busy(_) => "Busy",
        Error::Changed(_) => "Changed",
        Error::MissingDictionary { .. } => "MissingDictionary",
        Error::InvalidArgument(_) => "InvalidArgument",
        Error::Internal(_) => "Internal",
    }
}

/// "No such file or directory" on Linux.
const ENOENT: i32 = 2;

/// `[(variant name, the exception the binding raises for it)]` for every engine variant.
#[pyfunction]
fn engine_errors(py: Python<'_>) -> Vec<(&'static str, Py<PyAny>)> {
    every_variant()
        .into_iter()
        .map(|e| (variant_name(&e), crate::errors::to_py(e).into_value(py).into_any()))
        .collect()
}

/// Adds the hooks to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(engine_errors, m)?)
}
