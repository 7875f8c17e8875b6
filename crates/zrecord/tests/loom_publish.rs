//! Model-checks the length publication protocol with loom: a writer fills table slots and then
//! publishes the length; a reader that loads the length must see every slot below it fully
//! written. loom explores every interleaving and flags the data race if the orderings were too
//! weak.

use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use std::sync::atomic::Ordering;
use zrecord::published::{Atomic32, PublishedLen};

struct LoomU32(AtomicU32);

impl Atomic32 for LoomU32 {
    fn new(v: u32) -> Self {
        LoomU32(AtomicU32::new(v))
    }
    fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }
    fn store(&self, v: u32, order: Ordering) {
        self.0.store(v, order);
    }
}

struct Table {
    slots: [UnsafeCell<u64>; 3],
    len: PublishedLen<LoomU32>,
}

// SAFETY: the protocol under test is what makes sharing sound; loom checks every access.
unsafe impl Sync for Table {}

#[test]
fn published_entries_are_fully_visible() {
    loom::model(|| {
        let t = Arc::new(Table {
            slots: [UnsafeCell::new(0), UnsafeCell::new(0), UnsafeCell::new(0)],
            len: PublishedLen::new(0),
        });
        let writer = {
            let t = t.clone();
            loom::thread::spawn(move || {
                for (i, slot) in t.slots.iter().enumerate().take(2) {
                    // SAFETY: slots at or past the published length belong to the writer.
                    slot.with_mut(|p| unsafe { *p = 100 + i as u64 });
                    t.len.publish(i as u32 + 1);
                }
            })
        };
        let n = t.len.get();
        for slot in t.slots.iter().take(n as usize) {
            // SAFETY: slots below the published length are immutable.
            let v = slot.with(|p| unsafe { *p });
            assert!(v >= 100, "a published slot was read before it was written");
        }
        writer.join().unwrap();
        assert_eq!(t.len.get(), 2);
    });
}
