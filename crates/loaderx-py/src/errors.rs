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

/// The integer code loaderx 0.9.11's `ZrecordError` carried for this failure (`e.code`): -1
/// out of memory, -2 file I/O, -3 index out of range, -4 a record over the size limit, -5 the
/// store full, -6 a buffer too small (any unusable argument), -7 a record that fails to decode,
/// -8 not a store, -9 dictionary training failed.
fn code_of(err: &Error) -> i32 {
    match err {
        Error::Io { .. } | Error::Busy(_) | Error::Changed(_) => -2,
        Error::IndexOutOfRange { .. } => -3,
        Error::LimitExceeded { what, .. } if what.starts_with("record size") => -4,
        Error::LimitExceeded { .. } => -5,
        Error::Corrupt { path, .. } if path.file_name().is_some_and(|n| n == "meta.zr") => -8,
        Error::Corrupt { .. } | Error::MissingDictionary { .. } => -7,
        Error::InvalidArgument(m) if m.starts_with("dictionary training") => -9,
        Error::InvalidArgument(_) => -6,
        Error::Internal(_) => -1,
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
    raise(class_of(&err), err.to_string(), Some(code_of(&err)))
}

/// Every sampler error is an unusable argument (a zero length, a batch cyclic mode cannot
/// draw, a buffer of the wrong size).
pub fn sampler_to_py(err: SamplerError) -> PyErr {
    raise("LoaderxValueError", err.to_string(), None)
}

/// The binding's own check of an argument failed (a buffer that is not contiguous, writable
/// or large enough).
pub fn bad_argument(message: impl Into<String>) -> PyErr {
    raise("LoaderxValueError", message.into(), None)
}

/// A call on a store handle after `close()`.
pub fn closed() -> PyErr {
    raise("StoreClosedError", "store is closed".to_owned(), None)
}

/// An instance of `loaderx.errors.<class>`; with `code`, its `code` attribute set (else the
/// class's own, see `loaderx/errors.py`).
fn raise(class: &str, message: String, code: Option<i32>) -> PyErr {
    Python::attach(|py| {
        match py.import("loaderx.errors").and_then(|m| m.getattr(class)) {
            Ok(cls) => match cls.call1((message.clone(),)) {
                Ok(instance) => {
                    if let Some(code) = code {
                        if let Err(e) = instance.setattr("code", code) {
                            return e;
                        }
                    }
                    PyErr::from_value(instance)
                }
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
