//! The append frontier and the one rule for placing bytes behind it, used by appends and by
//! compaction (its packing plan and its staging area alike).
//!
//! The rule: a record never straddles two chunks (bytes that do not fit in the rest of the
//! current chunk start the next one), and a chunk filled exactly moves the frontier to the
//! start of the next chunk, so the frontier never names a full chunk (docs/FORMAT.md, header).

use crate::format::MAX_CHUNKS;

/// A position in a store's chunk address space, and the chunk capacity it advances by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frontier {
    /// Chunk the next bytes go to.
    pub chunk: u64,
    /// Offset in that chunk.
    pub offset: u64,
    capacity: u64,
}

impl Frontier {
    /// The frontier at `(chunk, offset)` in chunks of `capacity` bytes.
    pub fn new(chunk: u64, offset: u64, capacity: u64) -> Self {
        Frontier { chunk, offset, capacity }
    }

    /// `(chunk, offset)`, for comparing positions.
    pub fn at(&self) -> (u64, u64) {
        (self.chunk, self.offset)
    }

    /// Places `len` bytes at the frontier and moves it past them; returns where they go, or
    /// `None` when they would need a chunk past the last one ([`MAX_CHUNKS`]; empty records
    /// need none). `len` is at most the capacity (records are at most 1 MiB).
    pub fn place(&mut self, len: u64) -> Option<(u64, u64)> {
        if self.offset + len > self.capacity {
            (self.chunk, self.offset) = (self.chunk + 1, 0);
        }
        if self.chunk >= MAX_CHUNKS && len > 0 {
            return None;
        }
        let at = (self.chunk, self.offset);
        self.offset += len;
        if self.offset == self.capacity {
            (self.chunk, self.offset) = (self.chunk + 1, 0);
        }
        Some(at)
    }

    /// Places a run of `len > 0` bytes only where all of it fits behind the frontier in its
    /// chunk, with no move to the next chunk first: then the run lands where placing its
    /// records one by one would put them, back to back (`append.rs`, `plan_fixed`).
    pub fn place_run(&mut self, len: u64) -> Option<(u64, u64)> {
        if len == 0 || self.chunk >= MAX_CHUNKS || self.offset + len > self.capacity {
            return None;
        }
        self.place(len)
    }
}

#[cfg(test)]
mod tests {
    use super::Frontier;
    use crate::format::MAX_CHUNKS;

    #[test]
    fn fills_a_chunk_then_starts_the_next() {
        let mut f = Frontier::new(0, 0, 10);
        assert_eq!(f.place(4), Some((0, 0)));
        assert_eq!(f.place(4), Some((0, 4)));
        // 4 more would straddle: the next chunk starts.
        assert_eq!(f.place(4), Some((1, 0)));
        assert_eq!(f.at(), (1, 4));
    }

    #[test]
    fn an_exactly_full_chunk_moves_the_frontier_on() {
        let mut f = Frontier::new(0, 6, 10);
        assert_eq!(f.place(4), Some((0, 6)));
        assert_eq!(f.at(), (1, 0), "the frontier never names a full chunk");
        assert_eq!(f.place(10), Some((1, 0)));
        assert_eq!(f.at(), (2, 0));
    }

    #[test]
    fn empty_records_take_no_space_and_need_no_chunk() {
        let mut f = Frontier::new(MAX_CHUNKS, 0, 10);
        assert_eq!(f.place(0), Some((MAX_CHUNKS, 0)));
        assert_eq!(f.place(1), None);
        let mut f = Frontier::new(MAX_CHUNKS - 1, 8, 10);
        assert_eq!(f.place(2), Some((MAX_CHUNKS - 1, 8)));
        assert_eq!(f.place(1), None, "the last chunk is full");
    }

    /// Against a model: places never overlap, never straddle a chunk end, and follow each
    /// other in order.
    #[test]
    fn places_are_disjoint_ordered_and_inside_one_chunk() {
        let mut state = 12345u64;
        for capacity in [1u64, 7, 64, 1000] {
            let mut f = Frontier::new(0, 0, capacity);
            let mut last_end = (0u64, 0u64);
            for _ in 0..2000 {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                let len = (state >> 33) % (capacity + 1);
                let (chunk, offset) = f.place(len).unwrap();
                assert!(offset + len <= capacity, "straddles a chunk end");
                assert!((chunk, offset) >= last_end, "overlaps the bytes before");
                last_end = (chunk, offset + len);
                assert!(f.offset < capacity);
            }
        }
    }

    proptest::proptest! {
        /// What lets a pipelined append write before it knows every compressed size
        /// (`append.rs`, `fits_raw`): bytes placed no longer than others, one by one, never
        /// end further on, so if the raw sizes fit the chunk limit, the stored ones do.
        #[test]
        fn shorter_records_never_end_further(
            start in 0u64..50,
            pairs in proptest::collection::vec((0u64..=64, 0u64..=64), 0..200),
        ) {
            let (mut long, mut short) = (Frontier::new(0, start % 64, 64), Frontier::new(0, start % 64, 64));
            for (a, b) in pairs {
                let (big, small) = (a.max(b), a.min(b));
                long.place(big);
                short.place(small);
                proptest::prop_assert!(short.at() <= long.at());
            }
        }
    }
}
