//! The on-disk layout of a store, as `docs/FORMAT.md` defines it.
//!
//! `meta.zr` is a 16-byte [`Header`] followed by [`MAX_RECORDS`] [`RecordLoc`] entries, all
//! little-endian and used in place over an mmap. Chunk files `N.zr` hold record bytes; `dict.zr`
//! holds a raw zstd dictionary. This module only describes bytes; it performs no I/O.
// Decoders of bytes from files: no panicking shortcuts (docs/FORMAT.md is the contract).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use bytemuck::{Pod, Zeroable};

/// Magic bytes at the start of `meta.zr`.
pub const MAGIC: [u8; 4] = *b"ZREC";
/// The format version this engine reads and writes.
pub const VERSION: u16 = 3;
/// Largest logical size of one record: 1 MiB.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;
/// Most chunk files a store may have.
pub const MAX_CHUNKS: u64 = 1 << 12;
/// Capacity of one chunk file: 4 GiB.
pub const CHUNK_CAPACITY: u64 = 1 << 32;
/// Most records a store may hold; the record table is sized for exactly this many.
pub const MAX_RECORDS: u64 = MAX_CHUNKS * CHUNK_CAPACITY / MAX_RECORD_BYTES;
/// Size of the header at the start of `meta.zr`.
pub const HEADER_BYTES: u64 = 16;
/// Size of one record table entry.
pub const ENTRY_BYTES: u64 = 16;
/// Fixed size of `meta.zr`: the header plus a full table. The file is sparse.
pub const META_BYTES: u64 = HEADER_BYTES + MAX_RECORDS * ENTRY_BYTES;

/// File names inside a store directory.
pub const META_FILE: &str = "meta.zr";
/// Name of the dictionary file.
pub const DICT_FILE: &str = "dict.zr";
/// Largest `dict.zr` this engine reads or trains (32 MiB; zstd dictionaries are usually
/// kilobytes, and a store's own converters train at most 110 KiB).
pub const MAX_DICT_BYTES: u64 = 32 << 20;
/// Name of the change-counter file shared by every handle of a store.
pub const EPOCH_FILE: &str = "gen.zr";
/// Size of `gen.zr`.
pub const EPOCH_BYTES: u64 = 64;
/// Magic bytes at the start of `gen.zr`.
pub const EPOCH_MAGIC: [u8; 4] = *b"ZGEN";
/// The `gen.zr` version this engine reads and writes.
pub const EPOCH_VERSION: u16 = 1;
/// What a delete (or a replacement) adds to the epoch: its high 32 bits count changes of what
/// the indices name; the low 32 bits count compaction moves, which keep every index's record.
pub const EPOCH_CHANGE: u64 = 1 << 32;
/// What one compaction batch adds to the epoch.
pub const EPOCH_MOVE: u64 = 1;

/// Name of chunk file `id`.
pub fn chunk_file_name(id: u64) -> String {
    format!("{id}.zr")
}

// The static table size rests on this equality: the store runs out of record slots exactly when
// it could run out of chunk space, so neither limit can be hit "early" by the other.
const _: () = assert!(MAX_RECORDS == 1 << 24);
const _: () = assert!(std::mem::size_of::<Header>() == HEADER_BYTES as usize);
const _: () = assert!(std::mem::size_of::<RecordLoc>() == ENTRY_BYTES as usize);
const _: () = assert!(std::mem::align_of::<RecordLoc>() <= 16);
const _: () = assert!(std::mem::offset_of!(Header, length) == 12);
const _: () = assert!(std::mem::size_of::<EpochHeader>() == EPOCH_BYTES as usize);
const _: () = assert!(std::mem::offset_of!(EpochHeader, epoch) == 8);
const _: () = assert!(std::mem::offset_of!(EpochHeader, retired) == 16);

/// ## Format
/// Bytes 0..16 of `meta.zr`: `magic[4] | version u16 | tail_chunk u16 | tail_offset u32 | length u32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Header {
    /// Always [`MAGIC`].
    pub magic: [u8; 4],
    /// Always [`VERSION`].
    pub version: u16,
    /// Chunk holding the append frontier.
    pub tail_chunk: u16,
    /// Next free byte in `tail_chunk`.
    pub tail_offset: u32,
    /// Number of live records; every entry below it is live.
    pub length: u32,
}

impl Header {
    /// The header of a new, empty store.
    pub fn empty() -> Self {
        Header { magic: MAGIC, version: VERSION, tail_chunk: 0, tail_offset: 0, length: 0 }
    }
}

/// ## Format
/// `gen.zr` (a loaderx extension, see docs/FORMAT.md): `magic "ZGEN" | version u16 = 1 |
/// reserved u16 | epoch u64 | retired u64 | reserved [u64; 5]`. Used in place over a shared map:
/// `epoch` and `retired` are atomics that every handle of the store reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct EpochHeader {
    /// Always [`EPOCH_MAGIC`].
    pub magic: [u8; 4],
    /// Always [`EPOCH_VERSION`].
    pub version: u16,
    /// Written as zero.
    pub reserved: u16,
    /// Changes (high 32 bits) and compaction moves (low 32 bits) since the file was made.
    pub epoch: u64,
    /// Nonzero once the store was replaced or removed: no handle may write it any more.
    pub retired: u64,
    /// Written as zero.
    pub reserved_tail: [u64; 5],
}

impl EpochHeader {
    /// The contents of a new `gen.zr`.
    pub fn new() -> Self {
        EpochHeader {
            magic: EPOCH_MAGIC,
            version: EPOCH_VERSION,
            reserved: 0,
            epoch: 0,
            retired: 0,
            reserved_tail: [0; 5],
        }
    }
}

impl Default for EpochHeader {
    fn default() -> Self {
        Self::new()
    }
}

/// ## Format
/// One 16-byte table entry: `offset u32 | phys_length u32 | logic_length u32 | chunk_id u16 |
/// codec u8 | reserved u8`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RecordLoc {
    /// Byte offset of the stored bytes in the chunk.
    pub offset: u32,
    /// Stored (possibly compressed) size.
    pub phys_length: u32,
    /// Original size, what a gather returns.
    pub logic_length: u32,
    /// Chunk file holding the bytes.
    pub chunk_id: u16,
    /// [`Codec`] tag.
    pub codec: u8,
    /// Always written as zero; ignored on read.
    pub reserved: u8,
}

/// How one record's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Stored as given.
    Raw = 0,
    /// One zstd frame, level 3, no dictionary.
    Zstd = 1,
    /// One zstd frame, level 19, compressed against the store's `dict.zr`.
    ZstdDict = 2,
}

impl Codec {
    /// The codec for an on-disk tag, if it is one.
    pub fn from_tag(tag: u8) -> Option<Codec> {
        match tag {
            0 => Some(Codec::Raw),
            1 => Some(Codec::Zstd),
            2 => Some(Codec::ZstdDict),
            _ => None,
        }
    }

    /// Every codec, in tag order: the one list the binding and the Python API take names from.
    pub const ALL: [Codec; 3] = [Codec::Raw, Codec::Zstd, Codec::ZstdDict];

    /// The codec named by the Python API: `raw`, `zstd`, `zstd_dict` (also `zstdict`, the
    /// reference's spelling).
    pub fn from_name(name: &str) -> Option<Codec> {
        match name {
            "raw" => Some(Codec::Raw),
            "zstd" => Some(Codec::Zstd),
            "zstd_dict" | "zstdict" => Some(Codec::ZstdDict),
            _ => None,
        }
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Raw => "raw",
            Codec::Zstd => "zstd",
            Codec::ZstdDict => "zstd_dict",
        }
    }
}

/// Byte offset of table entry `index` inside `meta.zr`.
pub fn entry_position(index: u64) -> u64 {
    HEADER_BYTES + index * ENTRY_BYTES
}

// --- sums.zr: optional record checksums (a loaderx extension) -----------------------------

/// Name of the checksum file.
pub const SUMS_FILE: &str = "sums.zr";
/// Bytes before the first entry.
pub const SUMS_HEADER_BYTES: u64 = 16;
/// Size of `sums.zr`: the header and one entry per possible record (sparse).
pub const SUMS_BYTES: u64 = SUMS_HEADER_BYTES + MAX_RECORDS * 16;
pub const SUMS_MAGIC: [u8; 4] = *b"ZSUM";
pub const SUMS_VERSION: u16 = 1;
/// Checksum algorithm tag: 1 = XXH3-64.
pub const ALGORITHM_XXH3_64: u16 = 1;

/// ## Format
/// Bytes 0..16 of `sums.zr` (docs/FORMAT.md, "sums.zr"): `magic "ZSUM" | version u16 = 1 | algorithm u16 = 1 | reserved u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct SumsHeader {
    pub magic: [u8; 4],
    pub version: u16,
    pub algorithm: u16,
    pub reserved: u64,
}

/// ## Format
/// One 16-byte entry: `sum u64 | binding u64`. All zeros: no checksum.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct SumEntry {
    /// XXH3-64 of the record's logical (decoded) bytes.
    pub sum: u64,
    /// `sums::binding` of the table entry the sum belongs to.
    pub binding: u64,
}

const _: () = assert!(std::mem::size_of::<SumsHeader>() == SUMS_HEADER_BYTES as usize);
const _: () = assert!(std::mem::size_of::<SumEntry>() == 16);

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_are_little_endian_in_field_order() {
        let h = Header {
            magic: MAGIC,
            version: 3,
            tail_chunk: 0x0102,
            tail_offset: 0x0304_0506,
            length: 7,
        };
        let bytes = bytemuck::bytes_of(&h);
        assert_eq!(bytes, b"ZREC\x03\x00\x02\x01\x06\x05\x04\x03\x07\x00\x00\x00");
    }

    #[test]
    fn entry_bytes_are_little_endian_in_field_order() {
        let e = RecordLoc {
            offset: 1,
            phys_length: 2,
            logic_length: 3,
            chunk_id: 4,
            codec: 2,
            reserved: 0,
        };
        assert_eq!(
            bytemuck::bytes_of(&e),
            b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04\x00\x02\x00"
        );
    }

    #[test]
    fn codec_names_round_trip() {
        for c in Codec::ALL {
            assert_eq!(Codec::from_name(c.name()), Some(c));
            assert_eq!(Codec::from_tag(c as u8), Some(c));
        }
        assert_eq!(Codec::from_tag(3), None);
        assert_eq!(Codec::from_name("lz4"), None);
        assert_eq!(Codec::from_name("none"), None);
        assert_eq!(Codec::from_name("zstdict"), Some(Codec::ZstdDict));
    }
}
