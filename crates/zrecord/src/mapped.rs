//! The memory maps of a store's files: `meta.zr` (read and written in place), the shared
//! counters of `gen.zr`, and read-only maps of chunk files and of `sums.zr`. Their byte layouts
//! are in `format.rs` (docs/FORMAT.md).
//!
//! The rest of the crate sees safe types: [`MetaMap`] reads the header through atomics and table
//! entries by value, [`EpochMap`] exposes its counters as atomics, [`ChunkMap`] yields byte
//! slices only inside the file's known size.
#![expect(unsafe_code, reason = "views of mmap'd files as typed atomics and slices")]
#![expect(
    clippy::cast_ptr_alignment,
    reason = "maps start on a page boundary and every offset cast is a multiple of its type's \
              alignment (format.rs asserts the layouts)"
)]
// Decoders of bytes from files: no panicking shortcuts (docs/FORMAT.md is the contract).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::fs::File;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::format::{
    EpochHeader, Header, RecordLoc, SumEntry, EPOCH_BYTES, HEADER_BYTES, MAX_RECORDS, META_BYTES,
    SUMS_BYTES, SUMS_HEADER_BYTES,
};

/// `meta.zr` mapped whole, shared with the file (writes through `pwrite` are visible here).
pub struct MetaMap {
    map: MmapRaw,
}

impl MetaMap {
    /// Maps `file`, which the caller has checked is exactly [`META_BYTES`] long.
    pub fn new(file: &File, writable: bool) -> std::io::Result<Self> {
        let mut opts = MmapOptions::new();
        opts.len(META_BYTES as usize);
        // A raw map hands out no references; all access goes through the methods below.
        let map = if writable { opts.map_raw(file)? } else { opts.map_raw_read_only(file)? };
        debug_assert_eq!(map.len() as u64, META_BYTES);
        Ok(MetaMap { map })
    }

    fn header_words(&self) -> &[AtomicU32; 4] {
        // SAFETY: the mapping is page aligned and at least 16 bytes long, so it holds four
        // aligned u32 words for its whole life (`self`); AtomicU32 has the layout of u32 and
        // atomics are the right way to share memory another thread or process may write.
        unsafe { &*self.map.as_ptr().cast::<[AtomicU32; 4]>() }
    }

    /// The header as it is now. `length` is read last, with `Acquire`.
    pub fn header(&self) -> Header {
        let w = self.header_words();
        let magic = w[0].load(Ordering::Relaxed).to_le_bytes();
        let word1 = w[1].load(Ordering::Relaxed);
        let tail_offset = w[2].load(Ordering::Relaxed);
        let length = w[3].load(Ordering::Acquire);
        Header {
            magic,
            version: word1 as u16,
            tail_chunk: (word1 >> 16) as u16,
            tail_offset,
            length,
        }
    }

    /// The header's length word alone, with `Acquire`: one load, for readers that follow the
    /// writer's syncs live.
    pub fn length(&self) -> u32 {
        self.header_words()[3].load(Ordering::Acquire)
    }

    /// Stores the tail and then, with `Release`, the length. Magic and version are left alone.
    /// Needs a writable map; the caller checks.
    pub fn store_tail_and_length(&self, tail_chunk: u16, tail_offset: u32, length: u32) {
        let w = self.header_words();
        let version = w[1].load(Ordering::Relaxed) & 0xffff;
        w[1].store(version | (u32::from(tail_chunk) << 16), Ordering::Relaxed);
        w[2].store(tail_offset, Ordering::Relaxed);
        w[3].store(length, Ordering::Release);
    }

    /// Table entry `index`, read by value. Callers only ask for indices below a published
    /// length; those entries are immutable except under exclusive access (delete, compact).
    pub fn entry(&self, index: u64) -> RecordLoc {
        assert!(index < MAX_RECORDS, "table index {index} past the table");
        let at = (HEADER_BYTES + index * std::mem::size_of::<RecordLoc>() as u64) as usize;
        // SAFETY: `at + 16 <= META_BYTES`, the map's length, and `at` is 16-byte aligned in a
        // page-aligned map. The read is volatile because the bytes may be rewritten through the
        // file by this or another process; a torn read yields a wrong entry, which every user
        // bounds-checks, never undefined behaviour of the Rust abstract machine.
        unsafe { ptr::read_volatile(self.map.as_ptr().add(at).cast::<RecordLoc>()) }
    }

    /// `msync` of the header page.
    pub fn flush_header(&self) -> std::io::Result<()> {
        self.map.flush_range(0, HEADER_BYTES as usize)
    }
}

/// `gen.zr` mapped whole and shared with every handle of the store, in every process.
pub struct EpochMap {
    map: MmapRaw,
}

impl EpochMap {
    /// Maps `file`, which the caller has checked is exactly [`EPOCH_BYTES`] long.
    pub fn new(file: &File, writable: bool) -> std::io::Result<Self> {
        let mut opts = MmapOptions::new();
        opts.len(EPOCH_BYTES as usize);
        let map = if writable { opts.map_raw(file)? } else { opts.map_raw_read_only(file)? };
        Ok(EpochMap { map })
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= EPOCH_BYTES as usize);
        // SAFETY: the map is page aligned and EPOCH_BYTES long, so `offset` (a multiple of 8
        // inside it, from the two callers below) is an aligned u64 for the map's whole life;
        // atomics are how memory that other processes write is read and written.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The change counter (see docs/FORMAT.md, `gen.zr`).
    pub fn epoch(&self) -> &AtomicU64 {
        self.word(std::mem::offset_of!(EpochHeader, epoch))
    }

    /// Nonzero once the store was replaced or removed.
    pub fn retired(&self) -> &AtomicU64 {
        self.word(std::mem::offset_of!(EpochHeader, retired))
    }
}

/// `sums.zr` mapped read-only whole; entries are written with `pwrite` and read here.
pub struct SumsMap {
    map: MmapRaw,
}

impl SumsMap {
    /// Maps `file`, which the caller has checked is exactly [`SUMS_BYTES`] long.
    pub fn new(file: &File) -> std::io::Result<Self> {
        let map = MmapOptions::new().len(SUMS_BYTES as usize).map_raw_read_only(file)?;
        Ok(SumsMap { map })
    }

    /// Checksum entry `index`, read by value.
    pub fn entry(&self, index: u64) -> SumEntry {
        assert!(index < MAX_RECORDS, "checksum index {index} past the table");
        let at = (SUMS_HEADER_BYTES + index * std::mem::size_of::<SumEntry>() as u64) as usize;
        // SAFETY: `at + 16 <= SUMS_BYTES`, the map's length, and `at` is 16-byte aligned in a
        // page-aligned map. Volatile, as for table entries: the file may be rewritten through
        // `pwrite`; a torn read yields an entry that fails its binding check, never UB.
        unsafe { ptr::read_volatile(self.map.as_ptr().add(at).cast::<SumEntry>()) }
    }
}

/// A read-only map of one chunk file, reserved at the chunk's full capacity so it never needs to
/// be remapped as the file grows. Bytes past the file's end are never handed out: touching them
/// would raise SIGBUS.
pub struct ChunkMap {
    map: MmapRaw,
}

impl ChunkMap {
    /// Reserves `capacity` bytes of address space over `file`.
    pub fn new(file: &File, capacity: u64) -> std::io::Result<Self> {
        // Mapping past the end of a file is allowed; `bytes` only exposes ranges the caller has
        // checked against the file's current size.
        let map = MmapOptions::new().len(capacity as usize).map_raw_read_only(file)?;
        Ok(ChunkMap { map })
    }

    /// Asks the kernel to read no more around a page fault than the page itself: records are
    /// read at random, and the default readahead window (megabytes) would pull in far more
    /// than a record from the disk.
    pub fn advise_random(&self) -> std::io::Result<()> {
        self.map.advise(memmap2::Advice::Random)
    }

    /// Whether every page of `len` bytes at `offset` is in memory now (`mincore`). The caller
    /// has checked the range against the file's size.
    pub fn resident(&self, offset: u64, len: usize) -> bool {
        const PAGE: u64 = 4096;
        let start = offset / PAGE * PAGE;
        let end = (offset + len as u64).div_ceil(PAGE) * PAGE;
        if len == 0 || end > self.map.len() as u64 {
            return true;
        }
        let mut pages = [0u8; 64];
        let mut at = start;
        while at < end {
            let n = ((end - at) / PAGE).min(pages.len() as u64);
            // SAFETY: `at` is page aligned and `at + n * PAGE <= end <= map length`, so the range
            // lies inside this mapping; `pages` holds `n <= 64` bytes for mincore's answer.
            let rc = unsafe {
                libc::mincore(
                    self.map.as_ptr().add(at as usize) as *mut libc::c_void,
                    (n * PAGE) as usize,
                    pages.as_mut_ptr(),
                )
            };
            if rc != 0 || pages.iter().take(n as usize).any(|&p| p & 1 == 0) {
                return false;
            }
            at += n * PAGE;
        }
        true
    }

    /// `len` bytes at `offset`. The caller has checked `offset + len <= file size` and
    /// `<= capacity`; the assert guards the capacity against a caller bug.
    pub fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        let end = offset.saturating_add(len as u64);
        assert!(end <= self.map.len() as u64, "chunk range past the mapping");
        // SAFETY: in bounds of the mapping (asserted) and, by the caller's check, of the file,
        // so every page is backed. Records below the published length are immutable while
        // readers are active; the slice lives no longer than `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset as usize), len) }
    }
}
