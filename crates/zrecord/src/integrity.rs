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
    /// Each record that failed: its index and what is wrong, in index order.
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
    /// (closed store, exclusive operation in progress).
    pub fn verify(&self) -> Result<VerifyReport> {
        let _guard = self.activity.shared("verify")?;
        self.consistent_read(|| self.verify_once())
    }

    fn verify_once(&self) -> Result<VerifyReport> {
        let len = self.len();
        let sums = self.sums.get();
        let dict = self.dictionary();
        let mut blocks: Vec<(u64, u64)> =
            (0..len.div_ceil(BLOCK)).map(|b| (b * BLOCK, ((b + 1) * BLOCK).min(len))).collect();
        let found = Mutex::new(VerifyReport { records: len, ..Default::default() });
        let total = (len as usize).saturating_mul(1024);
        run_sharded(&mut blocks, total, |mine: &mut [(u64, u64)]| -> Result<()> {
            let mut decoder = Decoder::new(dict);
            let mut buf = Vec::new();
            let (mut checked, mut unchecked, mut failures) = (0, 0, Vec::new());
            for &(start, end) in mine.iter() {
                for index in start..end {
                    match self.decode_into(index, &mut buf, &mut decoder) {
                        Err(e) => failures.push((index, e.to_string())),
                        Ok(loc) => match sums.map(|s| s.check(index, &loc, &buf)) {
                            Some(Verdict::Good) => checked += 1,
                            Some(Verdict::Bad) => {
                                checked += 1;
                                let chunk = self.chunks.path(u64::from(loc.chunk_id));
                                failures.push((
                                    index,
                                    Error::checksum_mismatch(chunk, index).to_string(),
                                ));
                            }
                            Some(Verdict::Unchecked) | None => unchecked += 1,
                        },
                    }
                }
            }
            let mut r = found.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            r.checked += checked;
            r.unchecked += unchecked;
            r.failures.extend(failures);
            Ok(())
        })?;
        let mut report = found.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        report.failures.sort_by_key(|(i, _)| *i);
        Ok(report)
    }
}
