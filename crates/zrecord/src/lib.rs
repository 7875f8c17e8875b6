//! `zrecord`: the persistent record store under loaderx.
//!
//! A store is a directory holding `meta.zr` (a 16-byte header and a fixed table of 2^24
//! 16-byte record locations, used in place over an mmap), chunk files `0.zr`, `1.zr`, ... with the
//! record bytes, and optionally `dict.zr`, a zstd dictionary. `docs/FORMAT.md` is the normative
//! layout and `docs/DESIGN.md` the executor, concurrency and crash model.
//!
//! Records are byte strings addressed by a dense index `0..len`. Every operation is a batch:
//! [`Store::append`], [`Store::gather`], [`Store::lengths`], [`Store::delete`],
//! [`Store::compact`]. This crate has no Python in it; `crates/loaderx-py` binds it.

// Every `unsafe` block lives in a module that says why with `#![expect(unsafe_code)]`:
// mapped.rs (mmap views), slots.rs (lock-free table), pool.rs (pool slot), fork.rs (atfork),
// dict_training.rs (zstd's C trainer), writeback.rs (sync_file_range).
#![deny(unsafe_code)]

#[cfg(target_endian = "big")]
compile_error!(
    "zrecord stores are little-endian and used in place: big-endian hosts are not supported"
);

mod access;
pub mod across;
mod append;
mod blocks;
#[cfg(feature = "bench")]
pub mod ceiling;
mod chunks;
mod codec;
mod cold;
mod compact;
mod delete;
mod dict_training;
pub mod disk;
mod epoch;
mod error;
pub mod failpoint;
mod files;
pub mod fork;
pub mod format;
mod frontier;
mod gather;
mod integrity;
mod join;
mod mapped;
mod open_files;
mod parts;
mod pipeline;
pub mod pool;
pub mod profile;
pub mod published;
mod segments;
mod slots;
mod store;
pub mod sums;
mod truncate;
mod writeback;

pub use blocks::BlockLayout;
pub use compact::CompactReport;
pub use error::{Error, Result};
pub use format::Codec;
pub use integrity::VerifyReport;
pub use parts::{gather_parts_across, StoreParts};
pub use store::{Options, Stats, Store};
