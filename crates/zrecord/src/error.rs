//! The one error type of the engine. Every variant is a condition a caller can act on; the
//! binding maps each to a Python exception class in one place.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Result alias used throughout the engine.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in a store operation.
#[derive(Debug)]
pub enum Error {
    /// An operating-system call failed on `path` (open, read, write, sync, mmap, lock).
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// A store file holds bytes this engine cannot trust: wrong magic or version, a wrong size,
    /// a table entry outside its chunk, a bad zstd frame. Names the file and what is wrong.
    Corrupt {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it, for a human.
        detail: String,
    },
    /// A record index at or past the store's length.
    IndexOutOfRange {
        /// The offending index.
        index: u64,
        /// The store's length when it was checked.
        len: u64,
    },
    /// A format limit (record size, record count, chunk count) would be exceeded. Raised before
    /// anything is written.
    LimitExceeded {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: u64,
        /// What was asked for.
        requested: u64,
    },
    /// The call needs access it cannot have now: `delete`/`compact` while other calls are in
    /// flight, any call while `delete`/`compact` runs, or a write while another process (or
    /// another handle in this one) holds the writer lock.
    Busy(String),
    /// Another handle or process changed what this handle's indices name (deleted records,
    /// replaced or removed the store) since this handle last looked; the handle must accept the
    /// new state (`Store::refresh`) or be opened again before it reads or writes.
    Changed(String),
    /// A `zstd_dict` record or append in a store without `dict.zr`.
    MissingDictionary {
        /// The store directory.
        path: PathBuf,
    },
    /// The caller passed something unusable: unknown codec, bad offsets, overlapping or
    /// overflowing destination ranges, a dictionary that is already trained, samples a
    /// dictionary cannot be trained on.
    InvalidArgument(String),
    /// A failure no argument explains: zstd could not compress a record or rejected the
    /// dictionary it had just trained, or a test's failpoint fired.
    Internal(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        Error::Corrupt { path: path.into(), detail: detail.into() }
    }

    pub(crate) fn invalid(detail: impl Into<String>) -> Self {
        Error::InvalidArgument(detail.into())
    }

    /// A record whose bytes no longer match the checksum `sums.zr` keeps for it.
    pub(crate) fn checksum_mismatch(chunk: PathBuf, index: u64) -> Self {
        Error::corrupt(
            chunk,
            format!("record {index} does not match its checksum: its bytes changed"),
        )
    }

    pub(crate) fn internal(detail: impl Into<String>) -> Self {
        Error::Internal(detail.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Corrupt { path, detail } => {
                write!(f, "corrupt store file {}: {detail}", path.display())
            }
            Error::IndexOutOfRange { index, len } => {
                write!(f, "record index {index} is out of range for a store of {len} records")
            }
            Error::LimitExceeded { what, limit, requested } => {
                write!(f, "{what} limit exceeded: {requested} requested, the limit is {limit}")
            }
            Error::Busy(why) => write!(f, "store is busy: {why}"),
            Error::Changed(why) => write!(f, "store changed: {why}"),
            Error::MissingDictionary { path } => write!(
                f,
                "store {} has no dictionary (dict.zr): train one before using codec zstd_dict",
                path.display()
            ),
            Error::InvalidArgument(why) => f.write_str(why),
            Error::Internal(why) => write!(f, "internal error: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
