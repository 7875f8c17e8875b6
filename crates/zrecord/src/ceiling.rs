//! The benchmark's ceiling: copying fixed-size records at given indices out of an in-memory
//! buffer on the same pool and with the same sharding as `gather`. Whatever `gather` achieves is
//! measured against this, the cost of the memory traffic alone.

use crate::pool::run_sharded;

/// Copies record `indices[i]` (each `record` bytes, packed in `src`) to `dst[i * record..]`.
/// Panics if an index or the destination is out of range (a benchmark helper, not an API).
pub fn copy_records(src: &[u8], record: usize, indices: &[u64], dst: &mut [u8]) {
    assert!(dst.len() >= indices.len() * record, "destination too small");
    let mut jobs: Vec<(u64, &mut [u8])> =
        indices.iter().copied().zip(dst.chunks_mut(record.max(1))).collect();
    let total = indices.len() * record;
    let _ = run_sharded(&mut jobs, total, |block: &mut [(u64, &mut [u8])]| -> Result<(), ()> {
        for (index, out) in block.iter_mut() {
            let at = *index as usize * record;
            crate::codec::copy_bytes(out, &src[at..at + record]);
        }
        Ok(())
    });
}
