//! A fixed table of lazily created values that readers reach without a lock (the store's open
//! chunk files). Values are freed only when the table drops, so a reference handed out lives as
//! long as the table; nothing takes a lock, so a process forked while another thread was inside
//! it can go on using it.
#![expect(unsafe_code, reason = "a lock-free table of owned pointers")]

use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A fixed table of optional, lazily created values that readers reach without a lock.
/// Values are never freed before the table: a cleared slot moves its value to a graveyard (a
/// lock-free list), which is emptied when the table drops. Nothing here takes a lock, so a
/// process forked while another thread was inside it can go on using it.
pub struct Slots<T> {
    table: Box<[AtomicPtr<T>]>,
    graveyard: AtomicPtr<Grave<T>>,
    /// Owns `T`s and hands out `&T` across threads: Send needs `T: Send`, Sync `T: Send + Sync`.
    _owns: PhantomData<(Box<T>, std::sync::Mutex<T>)>,
}

struct Grave<T> {
    value: *mut T,
    next: *mut Grave<T>,
}

impl<T> Slots<T> {
    /// `n` empty slots.
    pub fn new(n: usize) -> Self {
        let slots = (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect();
        Slots { table: slots, graveyard: AtomicPtr::new(ptr::null_mut()), _owns: PhantomData }
    }

    /// The value in slot `i`, if set.
    pub fn get(&self, i: usize) -> Option<&T> {
        let p = self.table.get(i)?.load(Ordering::Acquire);
        // SAFETY: a non-null slot holds a pointer from Box::into_raw that is freed only when
        // the table drops (a cleared value goes to the graveyard), so it outlives `&self`.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Sets slot `i` unless it is already set, returning the value now there (a racing insert
    /// that lost drops its own value, which nobody has seen).
    pub fn insert(&self, i: usize, value: T) -> &T {
        let fresh = Box::into_raw(Box::new(value));
        match self.table[i].compare_exchange(
            ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: `fresh` is now owned by the table, which frees it only when it drops.
            Ok(_) => unsafe { &*fresh },
            Err(winner) => {
                // SAFETY: `fresh` lost the race, so no other thread has seen it: we still own
                // it. `winner` is a live slot value, kept until the table drops.
                unsafe {
                    drop(Box::from_raw(fresh));
                    &*winner
                }
            }
        }
    }

    /// Empties slot `i` if it still holds `expected` (or anything, when `expected` is None).
    /// The value stays alive, unreachable, until the table drops.
    pub fn clear(&self, i: usize, expected: Option<&T>) {
        let Some(slot) = self.table.get(i) else { return };
        let old = match expected {
            None => slot.swap(ptr::null_mut(), Ordering::AcqRel),
            Some(e) => {
                let e = std::ptr::from_ref::<T>(e).cast_mut();
                match slot.compare_exchange(e, ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(p) => p,
                    Err(_) => return,
                }
            }
        };
        if old.is_null() {
            return;
        }
        let grave = Box::into_raw(Box::new(Grave { value: old, next: ptr::null_mut() }));
        let mut head = self.graveyard.load(Ordering::Acquire);
        loop {
            // SAFETY: `grave` is ours until the exchange below publishes it.
            unsafe { (*grave).next = head };
            match self.graveyard.compare_exchange(head, grave, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        for slot in &self.table {
            let p = slot.swap(ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: with `&mut self` no borrow of a value is alive; each pointer came from
                // Box::into_raw and is in exactly one place (a slot or a grave).
                drop(unsafe { Box::from_raw(p) });
            }
        }
        let mut grave = *self.graveyard.get_mut();
        while !grave.is_null() {
            // SAFETY: as above; graves are freed once each, walking the list.
            let g = unsafe { Box::from_raw(grave) };
            // SAFETY: as above.
            drop(unsafe { Box::from_raw(g.value) });
            grave = g.next;
        }
    }
}
