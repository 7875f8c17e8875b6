//! A store handle: opening and creating, the writer's state, durability (`sync`), statistics and
//! the dictionary. The batch operations live beside it: `append.rs`, `gather.rs`, `delete.rs`,
//! `compact.rs`.
//!
//! ## Visibility and durability
//! Appended records are visible to every thread of the writing handle as soon as `append`
//! returns (its in-memory length is published atomically). The length in `meta.zr`'s header is
//! advanced only by [`Store::sync`] (and `close`), after the chunk data and the table entries are
//! on disk, so a crash of any kind leaves a header whose records are all intact. Every other
//! handle, in this process or another, reads that header's length live through its shared map:
//! what a writer syncs is visible to all of them at once.
//!
//! ## Other handles
//! The writer state (length, frontier) is read from disk when the writer lock is taken, never
//! earlier, so a write never starts from a stale view. Deletes and compactions by other handles
//! are announced through `gen.zr` (`epoch.rs`): a read notices them with two atomic loads.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::access::{inherited_handle, Activity, WriterLock};
use crate::chunks::ChunkSet;
use crate::codec::Dictionary;
use crate::disk::Disk;
use crate::epoch::Epoch;
use crate::error::{Error, Result};
use crate::failpoint::Failpoints;
use crate::files::{self, OPEN_FLAGS};
use crate::fork;
use crate::format::{
    Codec, Header, RecordLoc, CHUNK_CAPACITY, DICT_FILE, MAGIC, MAX_CHUNKS, MAX_DICT_BYTES,
    MAX_RECORDS, MAX_RECORD_BYTES, META_BYTES, META_FILE, VERSION,
};
use crate::mapped::MetaMap;
use crate::published::PublishedLen;
use crate::segments::OutputBuffers;
use crate::sums::Sums;

/// How often a read that overlapped another process's compaction is tried again before it
/// gives up with `Busy` (each batch of moves invalidates at most the reads running across it).
const READ_ATTEMPTS: usize = 1000;

/// How to open a store.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Codec of appends that do not name one.
    pub codec: Codec,
    /// Capacity of one chunk. Always [`CHUNK_CAPACITY`] outside tests; a smaller value lets a
    /// test roll chunks over without writing gigabytes.
    pub chunk_capacity: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options { codec: Codec::Zstd, chunk_capacity: CHUNK_CAPACITY }
    }
}

/// Space accounting returned by [`Store::stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Live records.
    pub records: u64,
    /// Stored bytes of the live records.
    pub live_bytes: u64,
    /// Logical (decoded) bytes of the live records.
    pub logical_bytes: u64,
    /// Chunk address space below the append frontier.
    pub chunk_bytes: u64,
    /// `chunk_bytes - live_bytes`: an upper bound of what `compact` can free.
    pub reclaimable: u64,
    /// Live records stored compressed (codec other than raw).
    pub compressed_records: u64,
    /// Chunk files the store spans (0 for an empty store).
    pub chunks: u64,
}

/// The append frontier and what `sync` still owes the disk. Guarded by the writer mutex.
pub(crate) struct WriterState {
    pub tail_chunk: u64,
    pub tail_offset: u64,
    pub lock: Option<WriterLock>,
    /// Chunks written since the last sync.
    pub dirty_chunks: BTreeSet<u64>,
    /// Table entries written since the last sync.
    pub dirty_table: bool,
    /// Checksum entries written since the last sync.
    pub dirty_sums: bool,
}

/// An open store. Share it between threads behind an `Arc`: every method takes `&self`.
pub struct Store {
    pub(crate) dir: PathBuf,
    pub(crate) meta_path: PathBuf,
    pub(crate) meta_file: File,
    pub(crate) meta: MetaMap,
    /// (device, inode) of the `meta.zr` this handle maps.
    meta_identity: (u64, u64),
    /// The writer's length, ahead of the header by its unsynced appends. Other handles read
    /// the header's.
    pub(crate) len: PublishedLen,
    /// Whether this handle holds the writer lock (then `len` is the length).
    writing: AtomicBool,
    /// Deletes and compactions by other handles (`gen.zr`).
    pub(crate) epoch: Epoch,
    /// The header's length and tail at the last attempt to map a `gen.zr` that did not exist.
    epoch_tried_at: (AtomicU32, AtomicU64),
    /// The fork epoch the handle was opened in (see `fork.rs`).
    fork_epoch: u64,
    pub(crate) chunks: ChunkSet,
    pub(crate) dict: OnceLock<Arc<Dictionary>>,
    pub(crate) writer: Mutex<WriterState>,
    pub(crate) activity: Activity,
    /// Why the store is open read-only (the errno that refused write access), if it is.
    read_only_errno: Option<i32>,
    pub(crate) default_codec: Codec,
    pub(crate) failpoints: Failpoints,
    pub(crate) disk: Arc<Disk>,
    /// Record checksums (`sums.zr`), when the store keeps them.
    pub(crate) sums: OnceLock<Sums>,
    /// Check every record read against its checksum.
    pub(crate) verify_reads: AtomicBool,
    /// The last gather or prefetch found records that were not in memory (`cold.rs`).
    pub(crate) recently_cold: AtomicBool,
    /// Until when (`cold.rs`'s clock) warm gathers skip the cold-read probe.
    pub(crate) warm_until_ns: AtomicU64,
    /// Consecutive gathers whose probe found their records in memory (`cold.rs`).
    pub(crate) warm_streak: AtomicU32,
    /// Compression output buffers kept from one append to the next (`segments.rs`).
    pub(crate) out_bufs: OutputBuffers,
}

impl Store {
    /// Opens the store in `dir`, creating the directory and an empty store if there is none.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        let dir = dir.as_ref().to_path_buf();
        if options.chunk_capacity == 0 || options.chunk_capacity > CHUNK_CAPACITY {
            return Err(Error::invalid(format!(
                "chunk capacity must be in 1..={CHUNK_CAPACITY}, got {}",
                options.chunk_capacity
            )));
        }
        match std::fs::metadata(&dir) {
            Ok(m) if !m.is_dir() => {
                return Err(Error::io(&dir, std::io::Error::from_raw_os_error(libc::ENOTDIR)))
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {
                std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            }
            Err(e) => return Err(Error::io(&dir, e)),
        }
        let meta_path = dir.join(META_FILE);
        let disk = Arc::new(Disk::default());
        if !meta_path.exists() {
            create_meta(&disk, &dir, &meta_path)?;
        }
        let fork_epoch = fork::epoch();
        let (meta_file, read_only_errno) = open_meta(&meta_path)?;
        let writable = read_only_errno.is_none();
        let size = meta_file.metadata().map_err(|e| Error::io(&meta_path, e))?.len();
        if size != META_BYTES {
            return Err(Error::corrupt(
                &meta_path,
                format!("meta.zr is {size} bytes, a store's is always {META_BYTES}"),
            ));
        }
        let meta_identity = files::identity(&meta_file).map_err(|e| Error::io(&meta_path, e))?;
        let meta = MetaMap::new(&meta_file, writable).map_err(|e| Error::io(&meta_path, e))?;
        let header = meta.header();
        check_header(&header, &meta_path, options.chunk_capacity)?;
        check_last_entry(&meta, &meta_file, &header, &meta_path, options.chunk_capacity)?;
        let epoch = Epoch::open(&dir, &disk, writable)?;
        // Failpoints is a unit struct without the `testing` feature.
        #[allow(clippy::default_constructed_unit_structs)]
        let store = Store {
            chunks: ChunkSet::new(&dir, options.chunk_capacity, writable, Arc::clone(&disk)),
            disk,
            len: PublishedLen::new(header.length),
            writing: AtomicBool::new(false),
            epoch,
            epoch_tried_at: (AtomicU32::new(header.length), AtomicU64::new(tail_of(&header))),
            fork_epoch,
            meta_identity,
            writer: Mutex::new(WriterState {
                tail_chunk: u64::from(header.tail_chunk),
                tail_offset: u64::from(header.tail_offset),
                lock: None,
                dirty_chunks: BTreeSet::new(),
                dirty_table: false,
                dirty_sums: false,
            }),
            sums: OnceLock::new(),
            verify_reads: AtomicBool::new(false),
            recently_cold: AtomicBool::new(false),
            warm_until_ns: AtomicU64::new(0),
            warm_streak: AtomicU32::new(0),
            out_bufs: OutputBuffers::default(),
            dict: OnceLock::new(),
            activity: Activity::default(),
            default_codec: options.codec,
            failpoints: Failpoints::default(),
            dir,
            meta_path,
            meta_file,
            meta,
            read_only_errno,
        };
        store.settle_interrupted_delete();
        store.epoch.settle_at_open(|| store.deleter_alive());
        store.load_dict()?;
        store.load_sums()?;
        Ok(store)
    }

    /// Opens `sums.zr` if the store has one and this handle has not loaded it yet (another
    /// process may have turned checksums on since this handle opened).
    fn load_sums(&self) -> Result<()> {
        if self.sums.get().is_none() {
            if let Some(sums) = Sums::open(&self.dir, self.read_only_errno.is_none())? {
                let _ = self.sums.set(sums);
            }
        }
        Ok(())
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// What identifies the records this handle's indices name: its `meta.zr` (device, inode:
    /// another store put at the path has others) and the deletes its view has taken in. A
    /// handle opened later at the same path names the same records at the same indices (up to
    /// the first one's length) exactly when both agree; appends change neither.
    pub fn view_token(&self) -> (u64, u64, u64) {
        (self.meta_identity.0, self.meta_identity.1, self.epoch.changes_seen())
    }

    /// Number of live records: the writer's own count on the writing handle, the synced
    /// header's (read live, so other handles' synced appends show at once) on every other. A
    /// writing handle inherited across fork also sees what its parent had appended by then.
    pub fn len(&self) -> u64 {
        if !self.writing.load(Ordering::Acquire) {
            self.live_len()
        } else if self.inherited() {
            self.live_len().max(u64::from(self.len.get()))
        } else {
            u64::from(self.len.get())
        }
    }

    /// The header's length now, clamped to the table (another process writes it).
    fn live_len(&self) -> u64 {
        u64::from(self.meta.length()).min(MAX_RECORDS)
    }

    /// Whether this handle holds the writer lock (a handle inherited across fork never does).
    pub fn is_writer(&self) -> bool {
        self.writing.load(Ordering::Acquire) && !fork::inherited(self.fork_epoch)
    }

    /// Whether this handle was inherited from the process that opened it, across `fork`.
    fn inherited(&self) -> bool {
        fork::inherited(self.fork_epoch)
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Codec used by appends that do not name one.
    pub fn default_codec(&self) -> Codec {
        self.default_codec
    }

    /// Size of the loaded dictionary in bytes, if the store has one.
    pub fn dict_size(&self) -> Option<usize> {
        self.dict.get().map(|d| d.raw().len())
    }

    /// Whether the store keeps record checksums (`sums.zr`).
    pub fn has_checksums(&self) -> bool {
        self.sums.get().is_some()
    }

    /// Whether every gather checks each record it reads against its checksum.
    pub fn verify_reads(&self) -> bool {
        self.verify_reads.load(Ordering::Relaxed)
    }

    /// Turns checking on every read on or off (it needs checksums to check anything).
    pub fn set_verify_reads(&self, on: bool) {
        self.verify_reads.store(on, Ordering::Relaxed);
    }

    /// Whether a dictionary (`dict.zr`) is loaded.
    pub fn has_dict(&self) -> bool {
        self.dict.get().is_some()
    }

    /// The failpoints of this handle (tests only).
    #[cfg(any(test, feature = "testing"))]
    pub fn failpoints(&self) -> &Failpoints {
        &self.failpoints
    }

    /// The storage layer of this handle, with its journal and injected failures (tests only).
    #[cfg(any(test, feature = "testing"))]
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Table entry `index`, bounds-checked against the length.
    pub fn entry(&self, index: u64) -> Result<RecordLoc> {
        self.consistent_read(|| {
            let len = self.len();
            if index >= len {
                return Err(Error::IndexOutOfRange { index, len });
            }
            Ok(self.meta.entry(index))
        })
    }

    /// Runs `read` against a consistent view: refused with [`Error::Changed`] when other handles
    /// deleted records since this handle last looked, run again when they moved records
    /// (compaction) while it ran, and run again once after loading a dictionary that another
    /// process trained since this handle opened.
    pub(crate) fn consistent_read<T>(&self, mut read: impl FnMut() -> Result<T>) -> Result<T> {
        let mut dict_reloaded = false;
        for _ in 0..READ_ATTEMPTS {
            let (start, stamp) = self.begin_read()?;
            let out = read();
            if !self.epoch.unchanged_since(start) || stamp.is_some_and(|s| s != self.stamp()) {
                continue;
            }
            match out {
                Err(Error::MissingDictionary { .. }) if !dict_reloaded && !self.has_dict() => {
                    dict_reloaded = true;
                    self.load_dict()?;
                    if !self.has_dict() {
                        return Err(Error::MissingDictionary { path: self.dir.clone() });
                    }
                }
                out => return out,
            }
        }
        Err(Error::Busy("another process keeps moving records (compaction); try again".into()))
    }

    /// The header's length and tail now.
    fn stamp(&self) -> (u32, u64) {
        let header = self.meta.header();
        (header.length, tail_of(&header))
    }

    /// The epoch a read starts at, after checking this handle's view (see `epoch.rs`), and, for a
    /// handle without `gen.zr`, the header's length and tail it starts at.
    ///
    /// Without `gen.zr` (none when this handle opened: a store 0.9.11 wrote), the handle looks
    /// for one again whenever the header's length or tail changed since it last looked: every
    /// delete changes the length, every compaction the tail before it writes over live bytes,
    /// and a writer makes `gen.zr` before either (`Epoch::require`). A read that overlapped such
    /// a change is read again.
    fn begin_read(&self) -> Result<(u64, Option<(u32, u64)>)> {
        let mut stamp = None;
        if !self.epoch.attached() {
            let now = self.stamp();
            let len_seen = self.epoch_tried_at.0.swap(now.0, Ordering::Relaxed);
            let tail_seen = self.epoch_tried_at.1.swap(now.1, Ordering::Relaxed);
            if (len_seen, tail_seen) != now {
                self.epoch.attach()?;
            }
            if !self.epoch.attached() {
                stamp = Some(now);
            }
        }
        Ok((self.epoch.begin(|| self.chunks.revalidate())?, stamp))
    }

    /// Accepts the store as other handles left it: after they deleted records (which makes
    /// reads fail with [`Error::Changed`] until then), the length and every index now mean
    /// what they mean on disk. Chunk files replaced since are reopened on next use.
    pub fn refresh(&self) -> Result<()> {
        self.epoch.attach()?;
        self.settle_interrupted_delete();
        self.epoch.accept(|| self.deleter_alive())?;
        self.chunks.revalidate();
        self.load_dict()?;
        self.load_sums()
    }

    /// A delete killed half-way leaves the change count odd, which makes every other handle
    /// wait for it. Whoever can take the writer lock knows no delete is under way and settles
    /// it; a handle that holds the lock already does the same. A handle that cannot write
    /// (read-only media, no permission) cannot settle it on disk, but it can still tell that
    /// nobody is deleting (see [`Store::deleter_alive`]) and then takes the store as it is.
    fn settle_interrupted_delete(&self) {
        if !self.epoch.deleting() || self.read_only_errno.is_some() {
            return;
        }
        if self.is_writer() {
            self.epoch.settle_interrupted();
        } else if let Ok(_lock) = WriterLock::acquire(&self.meta_path, self.meta_identity) {
            self.epoch.settle_interrupted();
        }
    }

    /// Whether some handle may be deleting now: one holds the writer lock (a delete runs only
    /// under it). A delete killed half-way leaves the count odd with nobody holding the lock.
    fn deleter_alive(&self) -> bool {
        if self.is_writer() {
            return false; // this handle holds the lock, and its own deletes are not under way
        }
        matches!(WriterLock::acquire(&self.meta_path, self.meta_identity), Err(Error::Busy(_)))
    }

    /// The writer mutex. A handle inherited across fork never takes it (a parent thread may
    /// have held it at the fork, and then it stays locked in the child forever).
    pub(crate) fn lock_writer(&self) -> Result<MutexGuard<'_, WriterState>> {
        if self.inherited() {
            return Err(inherited_handle());
        }
        Ok(self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Takes the writer lock for this handle if it does not hold it yet, then reads the writer
    /// state (length, frontier) from disk: whatever other handles did before, this handle
    /// writes from what is on disk now.
    pub(crate) fn ensure_writer(&self, state: &mut WriterState) -> Result<()> {
        if let Some(errno) = self.read_only_errno {
            // The OS error that refused write access on open (EACCES, EROFS), with the file.
            return Err(Error::io(&self.meta_path, std::io::Error::from_raw_os_error(errno)));
        }
        if state.lock.is_some() {
            return Ok(());
        }
        let lock = WriterLock::acquire(&self.meta_path, self.meta_identity)?;
        self.epoch.attach()?;
        if self.epoch.retired() {
            return Err(Error::Changed(format!(
                "the store at {} was replaced; open it again",
                self.dir.display()
            )));
        }
        // A delete elsewhere that was interrupted (we hold the lock: none is under way) is
        // settled; this handle's view still predates it, which `begin` then says.
        self.epoch.settle_interrupted();
        self.epoch.begin(|| {})?;
        let header = self.meta.header();
        check_header(&header, &self.meta_path, self.chunks.capacity())?;
        // Other writers may have removed, recreated, added or trained since this handle opened.
        self.chunks.revalidate();
        self.load_dict()?;
        self.load_sums()?;
        state.tail_chunk = u64::from(header.tail_chunk);
        state.tail_offset = u64::from(header.tail_offset);
        state.dirty_chunks.clear();
        (state.dirty_table, state.dirty_sums) = (false, false);
        self.len.publish(header.length);
        state.lock = Some(lock);
        self.writing.store(true, Ordering::Release);
        Ok(())
    }

    /// Takes the writer lock now rather than at the first write: refused at once with
    /// [`Error::Busy`] while another handle or process holds it.
    pub fn lock_for_writing(&self) -> Result<()> {
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)
    }

    /// Marks the store as replaced (the caller is about to put another store in its place):
    /// other handles' reads fail with [`Error::Changed`] and none can take the writer lock
    /// again. Takes the writer lock, so a store another process writes is refused.
    pub fn retire(&self) -> Result<()> {
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        self.sync_locked(&mut state)?;
        self.epoch.require(&self.disk)?;
        self.epoch.retire();
        Ok(())
    }

    /// Writes table entries starting at `first` with one positional write. The pages are backed
    /// by the write itself, so a full disk is an error here, never a SIGBUS later.
    pub(crate) fn write_entries(&self, first: u64, entries: &[RecordLoc]) -> Result<()> {
        let at = crate::format::entry_position(first);
        self.disk
            .write_at(&self.meta_file, &self.meta_path, at, bytemuck::cast_slice(entries))
            .map_err(|e| Error::io(&self.meta_path, e))
    }

    /// Makes everything appended so far durable and visible to other processes: chunk data,
    /// then table entries, then the header (tail and length), each synced before the next.
    pub fn sync(&self) -> Result<()> {
        if self.inherited() {
            return Ok(()); // the parent's writes are the parent's to sync
        }
        let mut state = self.lock_writer()?;
        self.sync_locked(&mut state)
    }

    pub(crate) fn sync_locked(&self, state: &mut WriterState) -> Result<()> {
        crate::profile::timed(crate::profile::Stage::Sync, || self.sync_unprofiled(state))
    }

    fn sync_unprofiled(&self, state: &mut WriterState) -> Result<()> {
        if state.lock.is_none() {
            return Ok(()); // never wrote: nothing to make durable
        }
        let len = self.len.get();
        let header = self.meta.header();
        let header_current = header.length == len
            && u64::from(header.tail_chunk) == state.tail_chunk
            && u64::from(header.tail_offset) == state.tail_offset;
        if state.dirty_chunks.is_empty()
            && !state.dirty_table
            && !state.dirty_sums
            && header_current
        {
            return Ok(());
        }
        for &id in &state.dirty_chunks {
            self.chunks.get(id)?.sync()?;
        }
        state.dirty_chunks.clear();
        if self.chunks.take_names_changed() {
            // A new chunk file's name must be durable before a header that counts its records.
            if let Err(e) = self.disk.sync_dir(&self.dir) {
                self.chunks.mark_names_changed();
                return Err(Error::io(&self.dir, e));
            }
        }
        if state.dirty_table {
            self.sync_meta()?;
            state.dirty_table = false;
        }
        if state.dirty_sums {
            if let Some(sums) = self.sums.get() {
                sums.sync(&self.disk)?;
            }
            state.dirty_sums = false;
        }
        self.failpoints.hit("sync:before-header").map_err(Error::internal)?;
        let (tail_chunk, tail_offset) = (state.tail_chunk as u16, state.tail_offset as u32);
        self.meta.store_tail_and_length(tail_chunk, tail_offset, len);
        self.disk.note_mapped_write(&self.meta_path, 0, bytemuck::bytes_of(&self.meta.header()));
        self.meta.flush_header().map_err(|e| Error::io(&self.meta_path, e))?;
        self.sync_meta()
    }

    /// `fdatasync` of `meta.zr`.
    pub(crate) fn sync_meta(&self) -> Result<()> {
        self.disk
            .sync_file(&self.meta_file, &self.meta_path)
            .map_err(|e| Error::io(&self.meta_path, e))
    }

    /// Syncs what this handle wrote and lets the writer lock go, so another handle or process
    /// may write. The handle stays usable (a later write takes the lock again); dropping it
    /// syncs too, ignoring errors, so call this to see them.
    pub fn close(&self) -> Result<()> {
        if self.inherited() {
            return Ok(());
        }
        let mut state = self.lock_writer()?;
        self.sync_locked(&mut state)?;
        self.writing.store(false, Ordering::Release);
        state.lock = None;
        self.out_bufs.clear();
        Ok(())
    }

    /// Record count and space accounting. Reads every live table entry: O(records).
    pub fn stats(&self) -> Result<Stats> {
        let _guard = self.activity.shared("stats")?;
        let (tail_chunk, tail_offset) = if self.is_writer() {
            let s = self.lock_writer()?;
            (s.tail_chunk, s.tail_offset)
        } else {
            let h = self.meta.header();
            (u64::from(h.tail_chunk), u64::from(h.tail_offset))
        };
        let mut st = self.consistent_read(|| {
            let len = self.len();
            let mut st = Stats { records: len, ..Stats::default() };
            for i in 0..len {
                let e = self.meta.entry(i);
                st.live_bytes += u64::from(e.phys_length);
                st.logical_bytes += u64::from(e.logic_length);
                st.compressed_records += u64::from(e.codec != Codec::Raw as u8);
            }
            Ok(st)
        })?;
        st.chunk_bytes = tail_chunk * self.chunks.capacity() + tail_offset;
        st.reclaimable = st.chunk_bytes.saturating_sub(st.live_bytes);
        st.chunks = if st.chunk_bytes == 0 { 0 } else { tail_chunk + u64::from(tail_offset > 0) };
        Ok(st)
    }

    /// Loads `dict.zr` if the store has one and this handle has not loaded it yet. Its size is
    /// checked against [`MAX_DICT_BYTES`] before anything is allocated; only the decoding side
    /// is prepared here (milliseconds even for megabytes), the encoding side on first use.
    pub(crate) fn load_dict(&self) -> Result<()> {
        if self.has_dict() {
            return Ok(());
        }
        let path = self.dir.join(DICT_FILE);
        let Some(file) = files::open_existing(&path, false)? else { return Ok(()) };
        let size = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        if size > MAX_DICT_BYTES {
            return Err(Error::corrupt(
                &path,
                format!("dict.zr is {size} bytes, over the {MAX_DICT_BYTES}-byte limit"),
            ));
        }
        let mut raw = Vec::with_capacity(size as usize);
        file.take(MAX_DICT_BYTES + 1).read_to_end(&mut raw).map_err(|e| Error::io(&path, e))?;
        if raw.len() as u64 != size {
            return Err(Error::corrupt(&path, "dict.zr changed size while it was read"));
        }
        let dict = Dictionary::new(raw)
            .ok_or_else(|| Error::corrupt(&path, "dict.zr is not a dictionary zstd accepts"))?;
        let _ = self.dict.set(Arc::new(dict));
        Ok(())
    }

    pub(crate) fn dictionary(&self) -> Option<&Dictionary> {
        self.dict.get().map(|d| &**d)
    }

    /// Trains a dictionary of at most `target` bytes on `samples` (the concatenation of samples
    /// of the given `sizes`), writes it to `dict.zr` and loads it. Returns its size. A store has
    /// one dictionary for life: training again is refused, since records already compressed
    /// against the first one could no longer be read.
    pub fn train_dict(&self, samples: &[u8], sizes: &[usize], target: usize) -> Result<usize> {
        let _guard = self.activity.shared("train_dict")?;
        if target == 0 || target as u64 > MAX_DICT_BYTES {
            return Err(Error::invalid(format!(
                "dictionary target size must be in 1..={MAX_DICT_BYTES} bytes, got {target}"
            )));
        }
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        if self.has_dict() {
            return Err(Error::invalid(format!(
                "store {} already has a dictionary; it cannot be replaced",
                self.dir.display()
            )));
        }
        let total: usize = sizes.iter().sum();
        if total != samples.len() {
            return Err(Error::invalid(format!(
                "sample sizes add up to {total} bytes but {} bytes of samples were given",
                samples.len()
            )));
        }
        let raw = crate::codec::train(samples, sizes, target)
            .map_err(|e| Error::invalid(format!("dictionary training failed: {e}")))?;
        let dict = Dictionary::new(raw)
            .ok_or_else(|| Error::internal("zstd rejected the dictionary it trained"))?;
        let size = dict.raw().len();
        let path = self.dir.join(DICT_FILE);
        self.disk.write_durably(&self.dir, &path, dict.raw(), size as u64)?;
        let _ = self.dict.set(Arc::new(dict));
        Ok(size)
    }
}

// A store is shared across threads behind an `Arc`; this fails to compile if a field ever
// stops being thread-safe.
const _: fn() = || {
    fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Store>();
};

impl Drop for Store {
    fn drop(&mut self) {
        if !self.inherited() {
            let _ = self.sync();
        }
    }
}

/// The append frontier a header names, as one number.
fn tail_of(header: &Header) -> u64 {
    (u64::from(header.tail_chunk) << 32) | u64::from(header.tail_offset)
}

fn check_header(h: &Header, path: &Path, capacity: u64) -> Result<()> {
    if h.magic != MAGIC {
        return Err(Error::corrupt(path, format!("bad magic {:?}: not a zrecord store", h.magic)));
    }
    if h.version != VERSION {
        return Err(Error::corrupt(
            path,
            format!("format version {} is not supported (this build reads {VERSION})", h.version),
        ));
    }
    if u64::from(h.length) > MAX_RECORDS {
        return Err(Error::corrupt(path, format!("length {} exceeds {MAX_RECORDS}", h.length)));
    }
    let tail_chunk = u64::from(h.tail_chunk);
    let full = tail_chunk == MAX_CHUNKS && h.tail_offset == 0;
    if !full && (tail_chunk >= MAX_CHUNKS || u64::from(h.tail_offset) >= capacity) {
        return Err(Error::corrupt(
            path,
            format!("append frontier ({}, {}) is out of range", h.tail_chunk, h.tail_offset),
        ));
    }
    Ok(())
}

/// The last live entry must be one a writer could have written: a valid codec and sizes, below
/// the frontier, and on a page of `meta.zr` that holds data (a header length past the records
/// ever written points into the file's holes). O(1): one entry and one `SEEK_DATA`.
fn check_last_entry(
    meta: &MetaMap,
    file: &File,
    h: &Header,
    path: &Path,
    capacity: u64,
) -> Result<()> {
    let Some(last) = u64::from(h.length).checked_sub(1) else { return Ok(()) };
    let e = meta.entry(last);
    let (chunk, end) = (u64::from(e.chunk_id), u64::from(e.offset) + u64::from(e.phys_length));
    let frontier = (u64::from(h.tail_chunk), u64::from(h.tail_offset));
    let plausible = Codec::from_tag(e.codec).is_some()
        && u64::from(e.logic_length) <= MAX_RECORD_BYTES
        && (e.codec != Codec::Raw as u8 || e.phys_length == e.logic_length)
        && end <= capacity
        && (chunk < frontier.0 || (chunk == frontier.0 && end <= frontier.1));
    let page = crate::format::entry_position(last) & !4095;
    let on_data = match rustix::fs::seek(file, rustix::fs::SeekFrom::Data(page)) {
        Ok(at) => at < page + 4096,
        Err(rustix::io::Errno::NXIO) => false,
        Err(_) => true, // no hole support: nothing to learn here
    };
    if plausible && on_data {
        return Ok(());
    }
    Err(Error::corrupt(
        path,
        format!(
            "the header counts {} records but entry {last} was never written by a store writer{}",
            h.length,
            if on_data { " (its location lies outside the data)" } else { "" }
        ),
    ))
}

/// Opens `meta.zr` read-write, or read-only with the errno that refused writing. Never follows a
/// symbolic link; anything but a regular file is a corrupt store.
fn open_meta(path: &Path) -> Result<(File, Option<i32>)> {
    let open = |write: bool| {
        OpenOptions::new().read(true).write(write).custom_flags(OPEN_FLAGS).open(path)
    };
    let (file, errno) = match open(true) {
        Ok(f) => (f, None),
        Err(e)
            if e.kind() == ErrorKind::PermissionDenied
                || e.kind() == ErrorKind::ReadOnlyFilesystem =>
        {
            let f = open(false).map_err(|e| files::refused(path, e))?;
            (f, Some(e.raw_os_error().unwrap_or(libc::EACCES)))
        }
        Err(e) => return Err(files::refused(path, e)),
    };
    files::check_regular(&file, path)?;
    Ok((file, errno))
}

/// Creates `meta.zr`: a sparse file with an empty header (see `create_once`).
fn create_meta(disk: &Disk, dir: &Path, meta_path: &Path) -> Result<()> {
    disk.create_once(dir, meta_path, bytemuck::bytes_of(&Header::empty()), META_BYTES)
}
