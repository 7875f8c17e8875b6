//! The one place errors become Python exceptions: the engine's (`zrecord::Error`), the
//! sampler's (`zsampler::SamplerError`) and the binding's own argument checks. The classes are
//! defined in Python (`loaderx/errors.py`, so they can also subclass `IndexError`,
//! `ValueError` and `TypeError`); OS failures become the built-in `OSError` subclass that
//! matches their errno. `tests/test_errors.py` pins every mapping.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use zrecord::Error;
use zsampler::SamplerError;

/// The `loaderx.errors` class each engine error is raised as.
fn class_of(err: &Error) -> &'static str {
    match err {
        Error::Io { .. } => "LoaderxError", // raised as OSError instead, see `to_py`
        Error::Corrupt { .. } => "CorruptStoreError",
        Error::IndexOutOfRange { .. } => "LoaderxIndexError",
        Error::LimitExceeded { .. } => "LimitExceededError",
        Error::Busy(_) => "StoreBusyError",
        Error::Changed(_) => "StoreChangedError",
        Error::MissingDictionary { .. } => "MissingDictionaryError",
        Error::InvalidArgument(_) => "LoaderxValueError",
        Error::Internal(_) => "InternalError",
    }
}

/// Converts an engine error into the matching Python exception.
pub fn to_py(err: Error) -> PyErr {
    if let Error::Io { path, source } = &err {
        let path = path.display().to_string();
        return match source.raw_os_error() {
            Some(code) => PyOSError::new_err((code, source.to_string(), path)),
            // The engine's own explanation of a full disk keeps ENOSPC's errno.
            None if source.kind() == std::io::ErrorKind::StorageFull => {
                PyOSError::new_err((libc::ENOSPC, source.to_string(), path))
            }
            None => PyOSError::new_err(format!("{path}: {source}")),
        };
    }
    raise(class_of(&err), err.to_string())
}

/// Every sampler error is an unusable argument (a zero length, a batch cyclic mode cannot
/// draw, a buffer of the wrong size).
pub fn sampler_to_py(err: SamplerError) -> PyErr {
    raise("LoaderxValueError", err.to_string())
}

/// The binding's own check of an argument failed (a buffer that is not contiguous, writable
/// or large enough).
pub fn bad_argument(message: impl Into<String>) -> PyErr {
    raise("LoaderxValueError", message.into())
}

/// A call on a store handle after `close()`.
pub fn closed() -> PyErr {
    raise("StoreClosedError", "store is closed".to_owned())
}

fn raise(class: &str, message: String) -> PyErr {
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
