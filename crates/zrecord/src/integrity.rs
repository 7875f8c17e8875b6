//! Integrity: turning record checksums on for a store (`enable_checksums`, which sums the
//! records already there) and checking a whole store (`verify`). The checksum file itself is
//! `sums.rs`; appends, deletes and compaction keep it current.

use std::sync::Mutex;

use crate::codec::Decoder;
use crate::error::{Error, Result};
use crate::format::SumEntry;
use crate::format::{RecordLoc, MAX_RECORD_BYTES};
use crate::pool::run_sharded;
use crate::store::Store;
use crate::sums::{binding, record_sum, Sums, Verdict};

/// Records per verification block.
const BLOCK: u64 = 4096;

/// What [`Store::verify`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Records decoded.
    pub records: u64,
    /// Records whose checksum was compared (and matched, unless listed in `failures`).
    pub checked: u64,
    /// Records decoded without a checksum to compare (none kept, or not bound to the record).
    pub unchecked: u64,
    /// Records that failed (decoding, or their checksum).
    pub failed: u64,
    /// The failed records of lowest index, at most as many as asked for: index and what is
    /// wrong, in index order.
    pub failures: Vec<(u64, String)>,
}

impl Store {
    /// Decodes record `index` into `buf` (resized to it) and returns its table entry.
    fn decode_into(&self, index: u64, buf: &mut Vec<u8>, dec: &mut Decoder) -> Result<RecordLoc> {
        let loc = self.meta.entry(index);
        buf.resize(u64::from(loc.logic_length).min(MAX_RECORD_BYTES) as usize, 0);
        self.read_record(index, &loc, buf, dec)?;
        Ok(loc)
    }

    /// Starts keeping record checksums: creates `sums.zr` and sums every record already in the
    /// store (decoding each one). Returns how many were summed; 0 if checksums were already on.
    /// A record that cannot be decoded fails the call, naming it. Needs exclusive access.
    pub fn enable_checksums(&self) -> Result<u64> {
        let _guard = self.activity.exclusive("enable_checksums")?;
        let mut state = self.lock_writer()?;
        self.ensure_writer(&mut state)?;
        if self.has_checksums() {
            return Ok(0);
        }
        let sums = Sums::create(&self.dir, &self.disk)?;
        let len = self.len();
        let dict = self.dictionary();
        let mut start = 0;
        while start < len {
            let end = (start + BLOCK).min(len);
            let mut decoder = Decoder::new(dict);
            let mut buf = Vec::new();
            let mut entries = Vec::with_capacity((end - start) as usize);
            for index in start..end {
                let loc = self.decode_into(index, &mut buf, &mut decoder)?;
                entries.push(SumEntry { sum: record_sum(&buf), binding: binding(&loc) });
            }
            sums.write(&self.disk, start, &entries)?;
            start = end;
        }
        sums.sync(&self.disk)?;
        let _ = self.sums.set(sums);
        Ok(len)
    }

    /// Decodes every record and compares it with its checksum when one is kept. Damage is
    /// reported per record in the result, not as an error; errors are for the call itself
    /// (closed store, exclusive operation in progress). At most `max_listed` failures are
    /// listed (the lowest indices), all of them counted, so memory stays bounded however much
    /// is damaged. Records are read in the order of their bytes; table entries naming the very
    /// same bytes (an interrupted delete leaves some) are decoded once, and entries whose bytes
    /// overlap another's without being the same are failures, never decoded: a hostile table
    /// cannot make verification decode more than the chunk files hold.
    pub fn verify(&self, max_listed: usize) -> Result<VerifyReport> {
        let _guard = self.activity.shared("verify")?;
        self.consistent_read(|| self.verify_once(max_listed))
    }

    fn verify_once(&self, max_listed: usize) -> Result<VerifyReport> {
        let len = self.len();
        let sums = self.sums.get();
        let dict = self.dictionary();
        // len <= MAX_RECORDS = 2^24: u32 indices halve the memory of the order.
        let mut order: Vec<(u32, RecordLoc)> =
            (0..len).map(|i| (i as u32, self.meta.entry(i))).collect();
        order.sort_unstable_by_key(|(i, e)| (e.chunk_id, e.offset, e.phys_length, *i));
        let overlapping = overlaps(&order);
        let found = Mutex::new(VerifyReport { records: len, ..Default::default() });
        let listed = Mutex::new(Listed::new(max_listed));
        let total = (len as usize).saturating_mul(1024);
        let mut blocks: Vec<&[(u32, RecordLoc)]> = order.chunks(BLOCK as usize).collect();
        run_sharded(&mut blocks, total, |mine: &mut [&[(u32, RecordLoc)]]| -> Result<()> {
            let mut decoder = Decoder::new(dict);
            let mut buf = Vec::new();
            let (mut checked, mut unchecked) = (0, 0);
            let mut failures = Listed::new(max_listed);
            // The entry decoded last and what decoding it gave.
            let mut last: Option<(RecordLoc, std::result::Result<(), String>)> = None;
            for &(index, loc) in mine.iter().flat_map(|b| b.iter()) {
                let index = u64::from(index);
                if let Some(other) = overlapping.get(&index) {
                    failures.push(index, || {
                        format!(
                            "record {index}: its bytes in chunk {} overlap those of record                              {other} (the table is damaged)",
                            loc.chunk_id
                        )
                    });
                    continue;
                }
                let decoded = match &last {
                    Some((prev, result)) if *prev == loc => result.clone(),
                    _ => {
                        let result = self
                            .decode_into(index, &mut buf, &mut decoder)
                            .map(|_| ())
                            .map_err(|e| e.to_string());
                        last = Some((loc, result.clone()));
                        result
                    }
                };
                match decoded {
                    Err(message) => failures.push(index, || message),
                    Ok(()) => match sums.map(|s| s.check(index, &loc, &buf)) {
                        Some(Verdict::Good) => checked += 1,
                        Some(Verdict::Bad) => {
                            checked += 1;
                            let chunk = self.chunks.path(u64::from(loc.chunk_id));
                            failures
                                .push(index, || Error::checksum_mismatch(chunk, index).to_string());
                        }
                        Some(Verdict::Unchecked) | None => unchecked += 1,
                    },
                }
            }
            let mut r = found.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            r.checked += checked;
            r.unchecked += unchecked;
            listed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).merge(failures);
            Ok(())
        })?;
        let mut report = found.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        let listed = listed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        report.failed = listed.count;
        report.failures = listed.into_sorted();
        Ok(report)
    }
}

/// The records (by index) whose bytes overlap an earlier record's in `order` (sorted by place)
/// without being the very same bytes, each with the record it overlaps.
fn overlaps(order: &[(u32, RecordLoc)]) -> std::collections::HashMap<u64, u64> {
    let mut found = std::collections::HashMap::new();
    // The entry reaching furthest in the current chunk so far.
    let mut reach: Option<(u32, RecordLoc, u64)> = None;
    for &(index, e) in order {
        if e.phys_length == 0 {
            continue;
        }
        let end = u64::from(e.offset) + u64::from(e.phys_length);
        if let Some((owner, o, owner_end)) = reach {
            if o.chunk_id == e.chunk_id && u64::from(e.offset) < owner_end {
                let same = (o.offset, o.phys_length) == (e.offset, e.phys_length);
                if !same {
                    // The intruder does not extend the reach: the records after it are judged
                    // against the ones that were there first.
                    found.insert(u64::from(index), u64::from(owner));
                    continue;
                }
                if end <= owner_end {
                    continue;
                }
            }
        }
        reach = Some((index, e, end));
    }
    found
}

/// Failures found: all counted, the `limit` of lowest index kept with their messages.
struct Listed {
    limit: usize,
    count: u64,
    kept: Vec<(u64, String)>,
}

impl Listed {
    fn new(limit: usize) -> Listed {
        Listed { limit, count: 0, kept: Vec::new() }
    }

    /// Counts a failure; builds its message only if it may be listed.
    fn push(&mut self, index: u64, message: impl FnOnce() -> String) {
        self.count += 1;
        if self.limit == 0 {
            return;
        }
        self.kept.push((index, message()));
        if self.kept.len() >= self.limit.saturating_mul(2) {
            self.trim();
        }
    }

    fn trim(&mut self) {
        self.kept.sort_unstable_by_key(|(i, _)| *i);
        self.kept.truncate(self.limit);
    }

    fn merge(&mut self, other: Listed) {
        self.count += other.count;
        self.kept.extend(other.kept);
        self.trim();
    }

    fn into_sorted(mut self) -> Vec<(u64, String)> {
        self.trim();
        self.kept
    }
}
