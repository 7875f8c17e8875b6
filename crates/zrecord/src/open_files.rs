//! Chunk files shared by every handle of one process.
//!
//! Each open chunk costs a descriptor and a mapping of its full capacity (4 GiB of address
//! space, one entry of `vm.max_map_count`, 65,530 by default). A store may have 4,096 chunks,
//! and a program often opens the same store several times (a dataset per stream, per worker
//! thread, per view): with a descriptor and a map each, a few full-size handles would exhaust
//! the map count. So handles of the same file -- the same (device, inode), capacity and access
//! -- share one [`OpenFile`]; it closes when the last handle lets it go.
//!
//! The table is behind a mutex, taken only to open a chunk. A child of `fork` may inherit it
//! locked (another parent thread was opening a chunk at that instant), so it is only ever
//! *tried*: when it cannot be had, the chunk is opened unshared, which is always correct.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, TryLockError, Weak};

use crate::mapped::ChunkMap;

/// An open chunk file and its map.
pub struct OpenFile {
    pub file: File,
    pub map: ChunkMap,
    /// (device, inode) of the file.
    pub identity: (u64, u64),
}

/// What makes two opens the same: the file, the mapped capacity and whether it is writable.
type Key = (u64, u64, u64, bool);

/// The open files by what makes them the same (made on first use).
type Table = Option<HashMap<Key, Weak<OpenFile>>>;

static TABLE: Mutex<Table> = Mutex::new(None);

/// Attempts at the table's lock before opening unshared.
const TRIES: usize = 1000;

/// The open file for `file` (already opened, identity `identity`): the one another handle of
/// this process has open, if any (then `file` is closed again), else `file` mapped by `map`.
pub fn share(
    file: File,
    identity: (u64, u64),
    capacity: u64,
    writable: bool,
    map: impl FnOnce(&File) -> std::io::Result<ChunkMap>,
) -> std::io::Result<Arc<OpenFile>> {
    let key = (identity.0, identity.1, capacity, writable);
    let Some(mut table) = lock() else {
        let map = map(&file)?;
        return Ok(Arc::new(OpenFile { file, map, identity }));
    };
    let table = table.get_or_insert_with(HashMap::new);
    if let Some(open) = table.get(&key).and_then(Weak::upgrade) {
        return Ok(open);
    }
    let map = map(&file)?;
    let open = Arc::new(OpenFile { file, map, identity });
    if table.len() >= 64 && table.len().is_power_of_two() {
        table.retain(|_, w| w.strong_count() > 0); // forget files every handle let go
    }
    table.insert(key, Arc::downgrade(&open));
    Ok(open)
}

fn lock() -> Option<std::sync::MutexGuard<'static, Table>> {
    for _ in 0..TRIES {
        match TABLE.try_lock() {
            Ok(guard) => return Some(guard),
            // A panic while the table was held left nothing half-done: entries are inserted whole.
            Err(TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}
