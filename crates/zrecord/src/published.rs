//! How a writer makes new records visible to lock-free readers.
//!
//! The writer fills table entries at and past the current length, then stores the new length
//! with `Release`; a reader loads the length with `Acquire` and only reads entries below it. The
//! protocol is generic over the atomic so that `tests/loom_publish.rs` can model-check it with
//! loom's atomics; the store uses `std`'s.

use std::sync::atomic::{AtomicU32, Ordering};

/// The operations the protocol needs from a 32-bit atomic.
pub trait Atomic32: Send + Sync {
    /// A new atomic holding `v`.
    fn new(v: u32) -> Self;
    /// Load with the given ordering.
    fn load(&self, order: Ordering) -> u32;
    /// Store with the given ordering.
    fn store(&self, v: u32, order: Ordering);
}

impl Atomic32 for AtomicU32 {
    fn new(v: u32) -> Self {
        AtomicU32::new(v)
    }
    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }
    fn store(&self, v: u32, order: Ordering) {
        AtomicU32::store(self, v, order);
    }
}

/// The number of records readers may see.
pub struct PublishedLen<A: Atomic32 = AtomicU32> {
    len: A,
}

impl<A: Atomic32> PublishedLen<A> {
    /// Starts at `len` records.
    pub fn new(len: u32) -> Self {
        PublishedLen { len: A::new(len) }
    }

    /// The length a reader may rely on: every entry below it was fully written before it was
    /// published.
    pub fn get(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    /// Makes entries below `len` visible. Call only after those entries are written, and only
    /// from the one writer (appends are serialized by the store's writer mutex).
    pub fn publish(&self, len: u32) {
        self.len.store(len, Ordering::Release);
    }
}
