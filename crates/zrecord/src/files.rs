//! Opening the files of a store that may come from anywhere (downloaded, unpacked, shared).
//!
//! Every file is opened by name inside the store directory without following a symbolic link
//! (`O_NOFOLLOW`) and without blocking (`O_NONBLOCK`, so a FIFO cannot hang the open), then
//! checked with `fstat` to be a regular file. Anything else (a symlink, a FIFO, a device, a
//! directory) is a corrupt store, reported at once, so a hostile store can neither make the engine
//! read or write a file outside its directory nor make it wait forever. The store directory
//! itself may be a symlink.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};

/// Flags every open of a store file carries.
pub(crate) const OPEN_FLAGS: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK;

/// What kind of file `meta` describes, for an error message.
fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Opens the existing store file `path` (read-only, or read-write with `write`). `Ok(None)` if
/// it does not exist; a corruption error if it is not a regular file.
pub(crate) fn open_existing(path: &Path, write: bool) -> Result<Option<File>> {
    let opened = with_fd_room(|| {
        OpenOptions::new().read(true).write(write).custom_flags(OPEN_FLAGS).open(path)
    });
    match opened {
        Ok(file) => {
            check_regular(&file, path)?;
            Ok(Some(file))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(refused(path, e)),
    }
}

/// Runs `open`; if it failed because the process has as many files open as its soft limit
/// allows (`EMFILE`; 1024 by default, and a store keeps one descriptor per chunk file), raises
/// the soft limit to the hard one and runs it once more.
pub(crate) fn with_fd_room<T>(open: impl Fn() -> io::Result<T>) -> io::Result<T> {
    match open() {
        Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
            use rustix::process::{getrlimit, setrlimit, Resource};
            let mut limit = getrlimit(Resource::Nofile);
            if limit.current.is_some() && limit.current < limit.maximum || limit.maximum.is_none() {
                limit.current = limit.maximum;
                if setrlimit(Resource::Nofile, limit).is_ok() {
                    return open();
                }
            }
            Err(e)
        }
        result => result,
    }
}

/// Maps an open error: a symbolic link (`ELOOP` under `O_NOFOLLOW`) or a directory opened for
/// writing is corruption of the store, anything else the OS error it is.
pub(crate) fn refused(path: &Path, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ELOOP) => Error::corrupt(path, "is a symbolic link; store files never are"),
        Some(libc::EISDIR) => Error::corrupt(path, "is a directory, not a store file"),
        _ => Error::io(path, e),
    }
}

/// Refuses anything but a regular file.
pub(crate) fn check_regular(file: &File, path: &Path) -> Result<()> {
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if meta.file_type().is_file() {
        Ok(())
    } else {
        Err(Error::corrupt(path, format!("is {}, not a regular file", kind_of(&meta))))
    }
}

/// The identity (device, inode) of an open file.
pub(crate) fn identity(file: &File) -> io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// The identity of the file named `path` now, without following a final symlink; `None` if
/// there is none.
pub(crate) fn identity_of_name(path: &Path) -> io::Result<Option<(u64, u64)>> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some((meta.dev(), meta.ino()))),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
