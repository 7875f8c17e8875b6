//! The chunk files `0.zr`, `1.zr`, ... of a store.
//!
//! Each chunk is opened on first use and mapped read-only at its full capacity; reads are
//! slices of that map, checked against the file's size, and writes are positional (`pwrite`), so
//! a full disk is an `ENOSPC` error rather than a SIGBUS. Files grow with their data: nothing is
//! preallocated (see docs/FORMAT.md), and nothing shrinks them (compaction punches holes), so a
//! map never loses a page it was allowed to read. Every change goes through the store's [`Disk`].
//!
//! Opened chunks are reached without a lock. Another handle's compaction may delete a chunk file
//! and a later append create one of the same name: [`ChunkSet::revalidate`] (run when the store's
//! epoch says records moved) drops every open chunk whose name now means another file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::files;
use crate::format::{chunk_file_name, MAX_CHUNKS};
use crate::mapped::ChunkMap;
use crate::open_files::{self, OpenFile};
use crate::slots::Slots;

/// One open chunk file, as one handle sees it.
pub struct Chunk {
    path: PathBuf,
    /// The descriptor and map, shared with the other handles of this process.
    open: Arc<OpenFile>,
    /// A lower bound of the file's size: grown by our writes, refreshed from the OS on a miss.
    size: AtomicU64,
    /// Where this handle last asked the kernel to start writing the file back (see
    /// [`WRITEBACK_BYTES`]).
    written_back: AtomicU64,
    capacity: u64,
    disk: Arc<Disk>,
}

/// Every this many bytes written to a chunk, the kernel is asked to start writing them to the
/// disk (without waiting): a long append's bytes then go to the disk while the rest are being
/// written, and the sync that commits them waits for the tail only, not for all of it (the
/// kernel's own writeback would start only once a share of memory is dirty). Durability is
/// unchanged: nothing counts as written before that sync.
pub const WRITEBACK_BYTES: u64 = 4 << 20;

impl Chunk {
    /// `len` stored bytes at `offset`, or a corruption error if they lie past the file's end.
    #[inline]
    pub fn read(&self, offset: u64, len: u64) -> Result<&[u8]> {
        let end = offset + len;
        // The common case, inlined into the read loops: inside what is known to be written.
        if end <= self.capacity && end <= self.size.load(Ordering::Acquire) {
            return Ok(self.open.map.bytes(offset, len as usize));
        }
        self.read_past_known_end(offset, len)
    }

    /// [`Chunk::read`] of bytes past the size last seen: the file may have grown since.
    #[cold]
    #[inline(never)]
    fn read_past_known_end(&self, offset: u64, len: u64) -> Result<&[u8]> {
        let end = offset + len;
        if end > self.capacity {
            return Err(Error::corrupt(
                &self.path,
                format!("range {offset}..{end} runs past the chunk capacity {}", self.capacity),
            ));
        }
        if end > self.size.load(Ordering::Acquire) {
            let now = self.file_size()?;
            self.size.fetch_max(now.min(self.capacity), Ordering::AcqRel);
            if end > now {
                return Err(Error::corrupt(
                    &self.path,
                    format!("range {offset}..{end} runs past the end of the file ({now} bytes)"),
                ));
            }
        }
        Ok(self.open.map.bytes(offset, len as usize))
    }

    /// Whether the `len` stored bytes at `offset` are all in memory (a probe: false when the
    /// range is not within the file either).
    pub fn resident(&self, offset: u64, len: u64) -> bool {
        offset + len <= self.size.load(Ordering::Acquire)
            && self.open.map.resident(offset, len as usize)
    }

    /// Reads the stored bytes at `offset` into `dst` with `pread` (records nothing has cached:
    /// the caller's thread waits on the disk, not on a page fault).
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.read(offset, dst.len() as u64)?; // the same range checks as a mapped read
        std::os::unix::fs::FileExt::read_exact_at(&self.open.file, dst, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::corrupt(&self.path, format!("range at {offset} ends past the file"))
            } else {
                Error::io(&self.path, e)
            }
        })
    }

    /// Starts reading `len` stored bytes at `offset` into the page cache, without waiting.
    pub fn prefetch(&self, offset: u64, len: u64) {
        if let Some(len) = std::num::NonZeroU64::new(len) {
            let _ = rustix::fs::fadvise(
                &self.open.file,
                offset,
                Some(len),
                rustix::fs::Advice::WillNeed,
            );
        }
    }

    /// Drops the (synced, clean) pages of `len` bytes at `offset` from the page cache.
    pub fn drop_cache(&self, offset: u64, len: u64) {
        if let Some(len) = std::num::NonZeroU64::new(len) {
            let _ = rustix::fs::fadvise(
                &self.open.file,
                offset,
                Some(len),
                rustix::fs::Advice::DontNeed,
            );
        }
    }

    /// Writes `data` at `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        crate::profile::timed(crate::profile::Stage::Write, || {
            self.disk.write_at(&self.open.file, &self.path, offset, data)
        })
        .map_err(|e| Error::io(&self.path, e))?;
        let end = offset + data.len() as u64;
        self.size.fetch_max(end, Ordering::AcqRel);
        let from = self.written_back.load(Ordering::Relaxed);
        // One thread starts each range (the writers of a pipelined append share the chunk);
        // bytes written behind the mark are written back by the commit's sync.
        if end >= from + WRITEBACK_BYTES
            && self
                .written_back
                .compare_exchange(from, end, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.disk.start_writeback(&self.open.file, &self.path, from, end - from);
        }
        Ok(())
    }

    /// `fdatasync` of the file.
    pub fn sync(&self) -> Result<()> {
        self.disk.sync_file(&self.open.file, &self.path).map_err(|e| Error::io(&self.path, e))
    }

    /// Frees the space from `offset` to the end of the file (after compaction), keeping the
    /// file's size: readers may still map those pages.
    pub fn punch_from(&self, offset: u64) -> Result<()> {
        let size = self.file_size()?;
        if size <= offset {
            return Ok(());
        }
        self.disk
            .punch_hole(&self.open.file, &self.path, offset, size - offset)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// The file's size as the OS sees it now.
    pub fn file_size(&self) -> Result<u64> {
        Ok(self.open.file.metadata().map_err(|e| Error::io(&self.path, e))?.len())
    }
}

/// The chunk files of one store, reachable without a lock once opened.
pub struct ChunkSet {
    dir: PathBuf,
    slots: Slots<Chunk>,
    capacity: u64,
    writable: bool,
    disk: Arc<Disk>,
    /// A chunk file was created or removed since the directory was last synced.
    names_changed: AtomicBool,
}

impl ChunkSet {
    /// The chunks of the store in `dir`, each `capacity` bytes at most.
    pub fn new(dir: &Path, capacity: u64, writable: bool, disk: Arc<Disk>) -> Self {
        ChunkSet {
            dir: dir.to_path_buf(),
            slots: Slots::new(MAX_CHUNKS as usize),
            capacity,
            writable,
            disk,
            names_changed: AtomicBool::new(false),
        }
    }

    /// Whether chunk files were created or removed since the last call: the directory then
    /// needs a sync before a header naming them becomes durable.
    pub fn take_names_changed(&self) -> bool {
        self.names_changed.swap(false, Ordering::AcqRel)
    }

    /// Marks the directory as needing a sync again (after a failed one).
    pub fn mark_names_changed(&self) {
        self.names_changed.store(true, Ordering::Release);
    }

    /// Capacity of one chunk.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Path of chunk `id`.
    pub fn path(&self, id: u64) -> PathBuf {
        self.dir.join(chunk_file_name(id))
    }

    /// Chunk `id`, opened if needed; a missing file is corruption.
    pub fn get(&self, id: u64) -> Result<&Chunk> {
        match self.slots.get(id as usize) {
            Some(c) => Ok(c),
            None => self.open(id, false),
        }
    }

    /// Chunk `id`, created if it does not exist yet (writers only).
    pub fn get_or_create(&self, id: u64) -> Result<&Chunk> {
        match self.slots.get(id as usize) {
            Some(c) => Ok(c),
            None => self.open(id, true),
        }
    }

    fn open(&self, id: u64, create: bool) -> Result<&Chunk> {
        if id >= MAX_CHUNKS {
            return Err(Error::invalid(format!(
                "chunk id {id} is past the {MAX_CHUNKS}-chunk limit"
            )));
        }
        let path = self.path(id);
        let file = if create && self.writable {
            let (file, created) = files::with_fd_room(|| self.disk.open_or_create(&path))
                .map_err(|e| files::refused(&path, e))?;
            if created {
                self.names_changed.store(true, Ordering::Release);
            }
            files::check_regular(&file, &path)?;
            file
        } else {
            files::open_existing(&path, self.writable)?
                .ok_or_else(|| Error::corrupt(&path, "chunk file is missing"))?
        };
        let meta = file.metadata().map_err(|e| Error::io(&path, e))?;
        let identity = files::identity(&file).map_err(|e| Error::io(&path, e))?;
        let capacity = self.capacity;
        let open = open_files::share(file, identity, capacity, self.writable, |file| {
            let map = ChunkMap::new(file, capacity)?;
            // Random access: no readahead window around a fault or a read (advice only: a
            // kernel that ignores it reads more, nothing else changes).
            let _ = map.advise_random();
            let _ = rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::Random);
            Ok(map)
        })
        .map_err(|e| Error::io(&path, e))?;
        let chunk = Chunk {
            path,
            open,
            size: AtomicU64::new(meta.len().min(self.capacity)),
            written_back: AtomicU64::new(meta.len()),
            capacity: self.capacity,
            disk: Arc::clone(&self.disk),
        };
        // Two threads may open the same chunk at once: the first insert wins, the other's
        // handle is dropped unseen.
        Ok(self.slots.insert(id as usize, chunk))
    }

    /// Forgets chunk `id` and deletes its file, if any (compaction, past the new frontier).
    pub fn remove(&self, id: u64) -> Result<bool> {
        self.slots.clear(id as usize, None);
        let path = self.path(id);
        let removed = self.disk.remove(&path).map_err(|e| Error::io(&path, e))?;
        if removed {
            self.names_changed.store(true, Ordering::Release);
        }
        Ok(removed)
    }

    /// Forgets every open chunk whose name no longer means the file this set opened (another
    /// handle's compaction deleted it, and maybe an append made a new one); the next use opens
    /// the name afresh. Open chunks stay alive until the set drops, so a read still using one
    /// is unaffected.
    pub fn revalidate(&self) {
        for id in 0..MAX_CHUNKS as usize {
            if let Some(chunk) = self.slots.get(id) {
                let now = files::identity_of_name(&chunk.path).ok().flatten();
                if now != Some(chunk.open.identity) {
                    self.slots.clear(id, Some(chunk));
                }
            }
        }
    }
}
