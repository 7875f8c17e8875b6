//! Whether the store changed under this handle: the shared counters of `gen.zr`.
//!
//! Readers take no lock, and other handles (in this process or another) may delete records or
//! compact the store while they read. `gen.zr` (docs/FORMAT.md) holds one 64-bit *epoch* that
//! every writer advances before it changes what a reader may be looking at:
//!
//! - a delete adds [`EPOCH_CHANGE`] before it touches the table and again once the new length
//!   is on disk, so the change count is odd exactly while a delete is under way (a replacement
//!   adds it twice at once). Indices now name other records: a handle whose view predates the
//!   change, or that reads while the count is odd, gets [`Error::Changed`] until it accepts the
//!   new state ([`Epoch::accept`], `Store::refresh`), which waits for the count to be even;
//! - a compaction adds [`EPOCH_MOVE`] before each batch of moves: every index keeps its record,
//!   only the bytes move, so a read that overlapped a move is simply read again.
//!
//! A read loads the epoch once before and once after (a seqlock without the writer's odd
//! state): two loads of a cache line that changes only when a writer does one of the above.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::files;
use crate::format::{
    EpochHeader, EPOCH_BYTES, EPOCH_CHANGE, EPOCH_FILE, EPOCH_MAGIC, EPOCH_VERSION,
};
use crate::mapped::EpochMap;

const MOVES: u64 = EPOCH_CHANGE - 1;

/// How long accepting a new state waits for another handle's delete to finish.
const SETTLE: Duration = Duration::from_secs(30);

/// Whether the change count of `epoch` is odd: a delete is under way.
fn deleting(epoch: u64) -> bool {
    epoch & EPOCH_CHANGE != 0
}

/// A handle's view of `gen.zr`.
pub struct Epoch {
    path: PathBuf,
    writable: bool,
    map: OnceLock<EpochMap>,
    /// The epoch this handle's view matches.
    seen: AtomicU64,
}

impl Epoch {
    /// Opens `gen.zr` in `dir`, creating it first when the store is writable (best effort: a
    /// directory we may not write into leaves the store without one until a writer makes it).
    pub fn open(dir: &Path, disk: &Disk, writable: bool) -> Result<Epoch> {
        let epoch = Epoch {
            path: dir.join(EPOCH_FILE),
            writable,
            map: OnceLock::new(),
            seen: AtomicU64::new(0),
        };
        if writable {
            match create(dir, &epoch.path, disk) {
                Err(Error::Io { .. }) | Ok(()) => {}
                Err(e) => return Err(e),
            }
        }
        if epoch.attach()? {
            epoch.seen.store(epoch.current(), Ordering::Relaxed);
        }
        Ok(epoch)
    }

    /// Maps `gen.zr` if it exists now; says whether this handle has it mapped. A handle that
    /// attaches late compares with the epoch the file started at (0), which is what it was when
    /// the handle opened: the file did not exist then.
    pub fn attach(&self) -> Result<bool> {
        if self.map.get().is_some() {
            return Ok(true);
        }
        let Some(file) = files::open_existing(&self.path, self.writable)? else {
            return Ok(false);
        };
        check(&file, &self.path)?;
        let map = EpochMap::new(&file, self.writable).map_err(|e| Error::io(&self.path, e))?;
        let _ = self.map.set(map);
        Ok(true)
    }

    /// The deletes and replacements this handle's view has taken in (the change count of the
    /// epoch it matches; compaction moves left out: they change no index).
    pub fn changes_seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire) & !MOVES
    }

    /// Whether the handle has `gen.zr` mapped.
    pub fn attached(&self) -> bool {
        self.map.get().is_some()
    }

    /// The epoch as it is now (0 without `gen.zr`).
    pub fn current(&self) -> u64 {
        self.map.get().map_or(0, |m| m.epoch().load(Ordering::Acquire))
    }

    /// Checks the handle's view before a read and returns the epoch the read starts at.
    /// `on_moves` runs when only compaction moves happened since the last check (the caller
    /// re-checks which chunk files it has open).
    pub fn begin(&self, on_moves: impl FnOnce()) -> Result<u64> {
        let now = self.current();
        let seen = self.seen.load(Ordering::Relaxed);
        if now == seen {
            return Ok(now);
        }
        // A view taken of an interrupted delete (odd count, nobody deleting) stays valid when a
        // writer later settles that count: the settling is the one step from odd to even.
        let settled = deleting(seen) && now & !MOVES == (seen & !MOVES).wrapping_add(EPOCH_CHANGE);
        if now & !MOVES != seen & !MOVES && !settled {
            return Err(Error::Changed(
                "records were deleted, or the store was replaced, by another handle or process \
                 since this handle last looked: indices may now name other records. Call \
                 refresh() to accept the new state, or open the store again"
                    .into(),
            ));
        }
        on_moves();
        self.seen.store(now, Ordering::Relaxed);
        Ok(now)
    }

    /// Whether nothing was deleted or moved since `start` (what [`Epoch::begin`] returned).
    /// The fence keeps the reads of the records before this load.
    pub fn unchanged_since(&self, start: u64) -> bool {
        fence(Ordering::Acquire);
        self.current() == start
    }

    /// Accepts the store as it is now as this handle's view, once no delete is under way in
    /// another handle (waiting up to [`SETTLE`] for one to finish; a delete takes milliseconds).
    /// `deleter_alive` says whether some handle may be deleting now (it holds the writer
    /// lock): when none is, an odd count is a delete that was killed half-way, and the store is
    /// accepted as that delete left it at once -- every entry of it is valid (see `delete.rs`),
    /// and a writer settling the count later does not change this view.
    pub fn accept(&self, deleter_alive: impl Fn() -> bool) -> Result<()> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let now = self.current();
            // A deleter ends its change before it lets the lock go: looking at the count again
            // after finding no deleter tells a finished delete from a killed one.
            if !deleting(now) || (!deleter_alive() && self.current() == now) {
                self.seen.store(now, Ordering::Relaxed);
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Busy(format!(
                    "another handle has been deleting records for over {} s and still holds the \
                     writer lock; try again once it is done",
                    SETTLE.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Takes the view of a handle that just opened: the store as it is, once no delete is under
    /// way (see [`Epoch::accept`]). If one does not finish in time, the view is left
    /// unaccepted, so reads fail with [`Error::Changed`] and `refresh()` explains, rather than
    /// read a half-applied delete.
    pub fn settle_at_open(&self, deleter_alive: impl Fn() -> bool) {
        if self.accept(deleter_alive).is_err() {
            self.seen.store(self.current() ^ EPOCH_CHANGE, Ordering::Relaxed);
        }
    }

    /// Whether a delete is under way (or was interrupted) in some handle.
    pub fn deleting(&self) -> bool {
        deleting(self.current())
    }

    /// Makes sure `gen.zr` exists and is mapped before a change other handles must learn of (a
    /// delete, compaction moves, a replacement): without it, nobody could tell them, so the
    /// change is refused (e.g. a full disk) rather than made in silence.
    pub fn require(&self, disk: &Disk) -> Result<()> {
        if self.attached() {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or_else(|| Path::new("."));
        create(dir, &self.path, disk)?;
        if self.attach()? {
            Ok(())
        } else {
            Err(Error::io(&self.path, std::io::Error::from(std::io::ErrorKind::NotFound)))
        }
    }

    /// Announces a delete before it touches the table: the change count becomes odd.
    pub fn begin_change(&self) {
        self.advance(|e| e.wrapping_add(EPOCH_CHANGE));
    }

    /// Announces that this handle's delete is complete and on disk: the change count becomes
    /// even.
    pub fn end_change(&self) {
        self.advance(|e| if deleting(e) { e.wrapping_add(EPOCH_CHANGE) } else { e });
    }

    /// Settles the odd count left by another handle's delete that was interrupted (the caller
    /// holds the writer lock, so none is under way). This handle's view is not updated: it
    /// predates that delete.
    pub fn settle_interrupted(&self) {
        if let Some(m) = self.map.get() {
            let next = |e: u64| Some(if deleting(e) { e.wrapping_add(EPOCH_CHANGE) } else { e });
            let _ = m.epoch().fetch_update(Ordering::AcqRel, Ordering::Acquire, next);
        }
    }

    /// Announces a batch of compaction moves, before writing over any stored bytes.
    pub fn bump_moves(&self) {
        self.advance(|e| (e & !MOVES) | (e.wrapping_add(1) & MOVES));
    }

    fn advance(&self, next: impl Fn(u64) -> u64) {
        if let Some(m) = self.map.get() {
            let before = m
                .epoch()
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| Some(next(e)))
                .unwrap_or_else(|e| e);
            // Release: the bump is visible before any write that follows it.
            fence(Ordering::Release);
            self.seen.store(next(before), Ordering::Relaxed);
        }
    }

    /// Marks the store replaced: every other handle's next read fails with [`Error::Changed`]
    /// and none may take the writer lock again.
    pub fn retire(&self) {
        if let Some(m) = self.map.get() {
            m.retired().store(1, Ordering::Release);
        }
        self.advance(|e| e.wrapping_add(2 * EPOCH_CHANGE));
    }

    /// Whether the store was replaced or removed.
    pub fn retired(&self) -> bool {
        self.map.get().is_some_and(|m| m.retired().load(Ordering::Acquire) != 0)
    }
}

/// Refuses a `gen.zr` of the wrong size, magic or version.
fn check(file: &File, path: &Path) -> Result<()> {
    let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut head = [0u8; 8];
    let read = if size == EPOCH_BYTES { file.read_exact_at(&mut head, 0).is_ok() } else { false };
    let ok =
        read && head[..4] == EPOCH_MAGIC && u16::from_le_bytes([head[4], head[5]]) == EPOCH_VERSION;
    if ok {
        Ok(())
    } else {
        Err(Error::corrupt(
            path,
            format!(
                "not a change-counter file this build reads ({size} bytes); it holds no data \
                 and may be deleted while no other process uses the store"
            ),
        ))
    }
}

/// Creates `gen.zr` unless it exists (`create_once`: the first file made is the one every
/// handle maps).
fn create(dir: &Path, path: &Path, disk: &Disk) -> Result<()> {
    if path.symlink_metadata().is_ok() {
        return Ok(());
    }
    let header = EpochHeader::new();
    disk.create_once(dir, path, bytemuck::bytes_of(&header), EPOCH_BYTES)
}
