//! Optional record checksums, kept in `sums.zr` beside the store (a loaderx extension that the
//! reference and other readers ignore; see docs/FORMAT.md, "sums.zr").
//!
//! Entry `i` holds the XXH3-64 of record `i`'s logical bytes and a *binding*: the XXH3-64 of
//! the table entry the sum was computed for. A sum counts only while its binding matches the
//! record's current table entry, so a record appended, moved or swapped by a writer that does
//! not keep checksums (the reference, or a crash between the two writes) reads as "unchecked",
//! never as a false failure.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytemuck::Zeroable;
use xxhash_rust::xxh3::xxh3_64;

use crate::disk::Disk;
use crate::error::{Error, Result};
use crate::format::{
    RecordLoc, SumEntry, SumsHeader, ALGORITHM_XXH3_64, SUMS_BYTES, SUMS_FILE, SUMS_HEADER_BYTES,
    SUMS_MAGIC, SUMS_VERSION,
};
use crate::mapped::SumsMap;

/// The checksum of a record's logical bytes.
pub fn record_sum(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// What ties a sum to one table entry; never 0, so an unwritten (zero) entry binds nothing.
pub fn binding(loc: &RecordLoc) -> u64 {
    xxh3_64(bytemuck::bytes_of(loc)) | 1
}

/// What a record's checksum says about bytes read for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The sum matches.
    Good,
    /// The sum does not match: the record's bytes changed since it was written.
    Bad,
    /// No sum is bound to the record's current table entry.
    Unchecked,
}

/// The open checksum file of a store.
pub struct Sums {
    path: PathBuf,
    file: File,
    map: SumsMap,
}

impl Sums {
    /// Opens `sums.zr` in `dir` if there is one.
    pub fn open(dir: &Path, writable: bool) -> Result<Option<Sums>> {
        let path = dir.join(SUMS_FILE);
        let Some(file) = crate::files::open_existing(&path, writable)? else { return Ok(None) };
        let size = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        if size != SUMS_BYTES {
            return Err(Error::corrupt(&path, format!("{size} bytes, sums.zr is {SUMS_BYTES}")));
        }
        let mut header = SumsHeader::zeroed();
        file.read_exact_at(bytemuck::bytes_of_mut(&mut header), 0)
            .map_err(|e| Error::io(&path, e))?;
        if header.magic != SUMS_MAGIC
            || header.version != SUMS_VERSION
            || header.algorithm != ALGORITHM_XXH3_64
        {
            return Err(Error::corrupt(
                &path,
                format!(
                    "not a checksum file this build reads (magic {:?}, version {}, algorithm {})",
                    header.magic, header.version, header.algorithm
                ),
            ));
        }
        let map = SumsMap::new(&file).map_err(|e| Error::io(&path, e))?;
        Ok(Some(Sums { path, file, map }))
    }

    /// Creates an empty `sums.zr` in `dir` (built aside, synced and renamed into place).
    pub fn create(dir: &Path, disk: &Disk) -> Result<Sums> {
        let path = dir.join(SUMS_FILE);
        let header = SumsHeader {
            magic: SUMS_MAGIC,
            version: SUMS_VERSION,
            algorithm: ALGORITHM_XXH3_64,
            reserved: 0,
        };
        disk.write_durably(dir, &path, bytemuck::bytes_of(&header), SUMS_BYTES)?;
        Sums::open(dir, true)?.ok_or_else(|| Error::corrupt(&path, "vanished after creation"))
    }

    /// Entry `index`.
    pub fn entry(&self, index: u64) -> SumEntry {
        self.map.entry(index)
    }

    /// Judges `bytes`, read for record `index` whose table entry is `loc`.
    pub fn check(&self, index: u64, loc: &RecordLoc, bytes: &[u8]) -> Verdict {
        let e = self.entry(index);
        if e.binding != binding(loc) {
            Verdict::Unchecked
        } else if e.sum == record_sum(bytes) {
            Verdict::Good
        } else {
            Verdict::Bad
        }
    }

    /// Writes entries starting at `first` with one positional write.
    pub fn write(&self, disk: &Disk, first: u64, entries: &[SumEntry]) -> Result<()> {
        let at = SUMS_HEADER_BYTES + first * 16;
        disk.write_at(&self.file, &self.path, at, bytemuck::cast_slice(entries))
            .map_err(|e| Error::io(&self.path, e))
    }

    /// `fdatasync` of the file.
    pub fn sync(&self, disk: &Disk) -> Result<()> {
        disk.sync_file(&self.file, &self.path).map_err(|e| Error::io(&self.path, e))
    }
}
