//! The one place engine errors become Python exceptions. The exception classes are defined in
//! Python (`loaderx/errors.py`, so they can also subclass `IndexError` and `ValueError`); OS
//! failures become the built-in `OSError` subclass that matches their errno.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use zrecord::Error;

/// Converts an engine error into the matching Python exception.
pub fn to_py(err: Error) -> PyErr {
    let class = match &err {
        Error::Io { path, source } => {
            let path = path.display().to_string();
            return match source.raw_os_error() {
                Some(code) => PyOSError::new_err((code, source.to_string(), path)),
                None => PyOSError::new_err(format!("{path}: {source}")),
            };
        }
        Error::Corrupt { .. } => "CorruptStoreError",
        Error::IndexOutOfRange { .. } => "ZrecordIndexError",
        Error::LimitExceeded { .. } => "LimitExceededError",
        Error::Busy(_) => "StoreBusyError",
        Error::Changed(_) => "StoreChangedError",
        Error::MissingDictionary { .. } => "MissingDictionaryError",
        Error::InvalidArgument(_) => "ZrecordValueError",
        Error::Closed => "StoreClosedError",
    };
    let message = err.to_string();
    Python::attach(|py| {
        match py.import("loaderx.errors").and_then(|m| m.getattr(class)) {
            Ok(cls) => match cls.call1((message.clone(),)) {
                Ok(instance) => PyErr::from_value(instance),
                Err(e) => e,
            },
            // The package is always importable beside its native module; fall back regardless.
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(message),
        }
    })
}

/// `map_err` helper.
pub trait IntoPyResult<T> {
    /// Maps the engine error to its Python exception.
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
