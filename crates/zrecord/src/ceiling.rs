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

/// The cold ceiling: reads `record` bytes at each of `offsets` of the file at `path` into
/// `dst[i * record..]` with plain `pread`s on `threads` threads (records handed out through one
/// atomic counter), the file advised `POSIX_FADV_RANDOM`: what parallel reads of exactly the
/// records get from the device. Panics if the destination is too small (a benchmark helper).
pub fn pread_records(
    path: &std::path::Path,
    offsets: &[u64],
    record: usize,
    dst: &mut [u8],
    threads: usize,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    assert!(dst.len() >= offsets.len() * record, "destination too small");
    let file = std::fs::File::open(path)?;
    let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random);
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<&mut [u8]>> = dst.chunks_mut(record.max(1)).map(Mutex::new).collect();
    let failure = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= offsets.len() {
                    return;
                }
                let mut out = slots[i].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Err(e) = file.read_exact_at(&mut out, offsets[i]) {
                    failure
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .get_or_insert(e);
                }
            });
        }
    });
    match failure.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
