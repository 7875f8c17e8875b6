//! `truncate`: drop the records past a count, moving nothing. A dataset directory's writer
//! trims what an interrupted append left past the directory's commit point: records no reader
//! of that commit point reads, so no other handle is told (no epoch change), and the bytes stay
//! where they are (the frontier does not move back: nothing a reader might still be copying is
//! written over) until `compact` reclaims them.

use crate::error::{Error, Result};
use crate::store::Store;

impl Store {
    /// Keeps records `0..len` and drops the rest, durably. Records below `len` keep their
    /// indices and bytes; other handles are not disturbed (their reads below `len` go on).
    pub fn truncate(&self, len: u64) -> Result<()> {
        let _guard = self.activity.exclusive("truncate")?;
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        let now = self.len();
        if len > now {
            return Err(Error::invalid(format!(
                "truncate to {len} records, but the store holds {now}"
            )));
        }
        if len == now {
            return Ok(());
        }
        state.dirty_table = true;
        // `len < now <= MAX_RECORDS`, which fits the header's u32.
        self.len.publish(u32::try_from(len).map_err(|e| Error::internal(e.to_string()))?);
        self.sync_locked(&mut state)
    }
}
