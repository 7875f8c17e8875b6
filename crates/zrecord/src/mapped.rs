//! Every `unsafe` block of the engine lives here: the mmap of `meta.zr`, read-only maps of chunk
//! files and of `sums.zr`, and the slot table that hands out chunk handles without a lock.
//!
//! The rest of the crate sees safe types: [`MetaMap`] reads the header through atomics and table
//! entries by value, [`ChunkMap`] yields byte slices only inside the file's known size, and
//! [`Slots`] yields references that live as long as the slot table.

use std::fs::File;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Mutex;

use memmap2::{MmapOptions, MmapRaw};

use crate::format::{Header, RecordLoc, HEADER_BYTES, MAX_RECORDS, META_BYTES};
use crate::sums::{SumEntry, SUMS_BYTES, SUMS_HEADER_BYTES};

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
        unsafe { &*(self.map.as_ptr() as *const [AtomicU32; 4]) }
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
        unsafe { ptr::read_volatile(self.map.as_ptr().add(at) as *const RecordLoc) }
    }

    /// `msync` of the header page.
    pub fn flush_header(&self) -> std::io::Result<()> {
        self.map.flush_range(0, HEADER_BYTES as usize)
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
        unsafe { ptr::read_volatile(self.map.as_ptr().add(at) as *const SumEntry) }
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

    /// `len` bytes at `offset`. The caller has checked `offset + len <= file size` and
    /// `<= capacity`; the assert guards the capacity against a caller bug.
    pub fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        let end = offset.checked_add(len as u64).expect("range overflow");
        assert!(end <= self.map.len() as u64, "chunk range past the mapping");
        // SAFETY: in bounds of the mapping (asserted) and, by the caller's check, of the file,
        // so every page is backed. Records below the published length are immutable while
        // readers are active; the slice lives no longer than `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset as usize), len) }
    }
}

/// A fixed table of optional, lazily created values that readers reach without a lock.
/// Values are never freed before the table: a cleared slot moves its value to a graveyard.
pub struct Slots<T> {
    slots: Box<[AtomicPtr<T>]>,
    owned: Mutex<Vec<Box<T>>>,
}

impl<T> Slots<T> {
    /// `n` empty slots.
    pub fn new(n: usize) -> Self {
        let slots = (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect();
        Slots { slots, owned: Mutex::new(Vec::new()) }
    }

    /// The value in slot `i`, if set.
    pub fn get(&self, i: usize) -> Option<&T> {
        let p = self.slots.get(i)?.load(Ordering::Acquire);
        // SAFETY: a non-null slot points into a Box held by `owned`; boxes are only dropped with
        // `self`, so the value outlives the returned borrow of `self`.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Sets slot `i` unless it is already set, returning the value now there. Callers serialize
    /// `get_or_insert` for the same slot (the creator holds a mutex).
    pub fn insert(&self, i: usize, value: T) -> &T {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = self.get(i) {
            return v;
        }
        let mut boxed = Box::new(value);
        let p: *mut T = &mut *boxed;
        owned.push(boxed);
        self.slots[i].store(p, Ordering::Release);
        // SAFETY: `p` points into the box just moved into `owned`, alive as long as `self`.
        unsafe { &*p }
    }

    /// Empties slot `i`. The value stays alive (unreachable) until the table drops.
    pub fn clear(&self, i: usize) {
        if let Some(s) = self.slots.get(i) {
            s.store(ptr::null_mut(), Ordering::Release);
        }
    }
}
