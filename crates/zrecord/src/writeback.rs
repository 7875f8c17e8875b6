//! Starting the write-back of a file range without waiting for it: one system call the standard
//! library and rustix do not offer, `sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE` (Linux).
//! A hint to the kernel: it makes nothing durable, and its errors are the sync's to report.
#![expect(unsafe_code, reason = "sync_file_range is a libc call")]

use std::fs::File;

/// Asks the kernel to start writing `len` bytes at `offset` of `file` to the disk; returns at
/// once (or when the device's queue has room). Does nothing elsewhere than Linux.
pub fn start(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: the descriptor is borrowed from `file`, which stays open for the whole call;
        // the call takes integers only and reads or writes no memory of this process.
        let _ = unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}
