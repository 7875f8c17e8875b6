//! `delete`: swap the last live entry into each hole, in descending index order, so the live
//! records stay exactly `0..len`. Needs exclusive access; the freed bytes become garbage for
//! `compact`.

use crate::error::{Error, Result};
use crate::store::Store;

impl Store {
    /// Deletes the records at `indices` (duplicates are deleted once). The indices of other
    /// records may change: the record at the end moves into each hole. Durable on return.
    pub fn delete(&self, indices: &[u64]) -> Result<()> {
        let _guard = self.activity.exclusive("delete")?;
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        let len = self.len();
        if let Some(&index) = indices.iter().find(|&&i| i >= len) {
            return Err(Error::IndexOutOfRange { index, len });
        }
        let mut targets = indices.to_vec();
        targets.sort_unstable_by(|a, b| b.cmp(a));
        targets.dedup();
        // Other handles see the synced records only: when a target is among them, their reads
        // must learn that indices change before any of them does. Deleting records no one else
        // has seen (a converter rolling back its own appends) changes nothing for them.
        let announced = targets.last().is_some_and(|&t| t < u64::from(self.meta.length()));
        if announced {
            // Other handles learn of the delete through gen.zr; without one (it could not be
            // made: a full disk) they would read other records at the same indices in silence.
            self.epoch.require(&self.disk)?;
            self.epoch.begin_change();
        }
        // Descending order: each swap pulls from the current last slot, which no later (smaller)
        // target can name.
        let mut live = len;
        let mut result = Ok(());
        for &hole in &targets {
            let last = live - 1;
            if hole != last {
                let moved = self.meta.entry(last);
                if let Err(e) = self.write_entries(hole, &[moved]) {
                    result = Err(e);
                    break;
                }
                // The checksum travels with its record (its binding still matches).
                if let Some(sums) = self.sums.get() {
                    if let Err(e) = sums.write(&self.disk, hole, &[sums.entry(last)]) {
                        result = Err(e);
                        break;
                    }
                    state.dirty_sums = true;
                }
            }
            live -= 1;
            if let Err(e) = self.failpoints.hit("delete:swapped") {
                result = Err(Error::internal(e));
                break;
            }
        }
        state.dirty_table = true;
        // Publish what was done, even after an error: every entry below `live` is valid.
        self.len.publish(live as u32);
        let synced = result.and_then(|()| self.sync_locked(&mut state));
        if announced {
            // Even after an error: what is on disk is a consistent store either way, and other
            // handles must be able to accept it.
            self.epoch.end_change();
        }
        synced
    }
}
