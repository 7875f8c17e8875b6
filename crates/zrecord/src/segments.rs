//! Segments of an append: runs of consecutive records compressed together into one output
//! buffer, the unit that the pipeline (`pipeline.rs`) hands from compressing to placing to
//! writing, and that a serial append compresses in parallel blocks.
//!
//! A segment's buffer holds its records' frames back to back; a record that does not shrink
//! stays in the caller's buffer (raw). Buffers come from the store's [`OutputBuffers`] and go
//! back after the write, so an append neither allocates per record nor faults in fresh memory
//! once the first append has sized them.

use std::ops::Range;
use std::sync::Mutex;

use crate::codec::Encoder;
use crate::error::{Error, Result};
use crate::format::Codec;
use crate::sums::record_sum;

/// Most raw bytes in one segment (a single larger record makes a segment of its own): small
/// enough that a segment's frames are still in cache when it is written, large enough that
/// handing it over costs nothing next to compressing it.
pub const SEGMENT_BYTES: usize = 1 << 20;
/// Fewest raw bytes a segment aims at when an append is split finely to spread over the pool.
const MIN_SEGMENT_BYTES: usize = 64 << 10;
/// Segments per thread that a small append is split into, so that a slow one leaves little
/// idle time at the end.
const SEGMENTS_PER_THREAD: usize = 4;

/// Where a record's stored bytes are: in the caller's buffer, or in a segment's output buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Buf {
    Caller,
    Shard(usize),
}

/// One record on its way in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pending {
    /// Byte range of the record in the caller's buffer.
    pub src: (usize, usize),
    /// How it is stored, and where those bytes are.
    pub codec: Codec,
    pub buf: Buf,
    pub stored: (usize, usize),
}

/// One segment on its way to the disk.
pub struct Segment {
    /// Each record's stored form, `buf` naming [`Buf::Shard`] for bytes in [`Segment::out`].
    pub pending: Vec<Pending>,
    /// The frames of the records stored compressed, back to back.
    pub out: Vec<u8>,
    /// The records' checksums (empty when the store keeps none).
    pub sums: Vec<u64>,
}

/// Splits the records of `ranges` into consecutive segments of about `SEGMENT_BYTES` raw
/// bytes, finer for an append too small to give each of `threads` threads several segments.
pub fn split(ranges: &[(usize, usize)], threads: usize) -> Vec<Range<usize>> {
    let total: usize = ranges.iter().map(|&(a, b)| b - a).sum();
    let target =
        (total / (threads.max(1) * SEGMENTS_PER_THREAD)).clamp(MIN_SEGMENT_BYTES, SEGMENT_BYTES);
    let mut segments = Vec::with_capacity(total / target + 1);
    let (mut start, mut bytes) = (0, 0);
    for (i, &(a, b)) in ranges.iter().enumerate() {
        bytes += b - a;
        if bytes >= target {
            segments.push(start..i + 1);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < ranges.len() {
        segments.push(start..ranges.len());
    }
    segments
}

/// Sums (when `with_sums`) and compresses the records `records` of `src` into a buffer taken
/// from `bufs` (none for a raw append, which only sums), grown to the segment's raw size if it
/// is smaller (frames never exceed their records).
pub fn compress(
    encoder: &mut Encoder<'_>,
    src: &[u8],
    ranges: &[(usize, usize)],
    records: Range<usize>,
    codec: Codec,
    with_sums: bool,
    bufs: &OutputBuffers,
) -> Result<Segment> {
    let spans = &ranges[records];
    let mut pending = Vec::with_capacity(spans.len());
    let mut sums = Vec::with_capacity(if with_sums { spans.len() } else { 0 });
    let mut out = Vec::new();
    if codec != Codec::Raw {
        out = bufs.take();
        let need: usize = spans.iter().map(|&(a, b)| b - a).sum();
        if out.len() < need {
            out.resize(need, 0);
        }
    }
    let mut at = 0;
    for &(a, b) in spans {
        let bytes = &src[a..b];
        if with_sums {
            // Taken before compressing, while the record's bytes are in cache.
            sums.push(crate::profile::timed(crate::profile::Stage::Checksum, || record_sum(bytes)));
        }
        let mut stored =
            Pending { src: (a, b), codec: Codec::Raw, buf: Buf::Caller, stored: (a, b) };
        if codec != Codec::Raw {
            let frame = crate::profile::timed(crate::profile::Stage::Compress, || {
                encoder.encode_into(codec, bytes, &mut out[at..])
            })
            .map_err(|e| Error::internal(format!("compression failed: {e}")))?;
            if let Some(n) = frame {
                stored.codec = codec;
                stored.buf = Buf::Shard(0);
                stored.stored = (at, at + n);
                at += n;
            }
        }
        pending.push(stored);
    }
    Ok(Segment { pending, out, sums })
}

/// The output buffers of a store's appends, kept between appends (a few per pool thread) and
/// dropped when the store closes.
#[derive(Default)]
pub struct OutputBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl OutputBuffers {
    /// A buffer to compress into (empty when none is free: `compress` sizes it).
    pub fn take(&self) -> Vec<u8> {
        self.lock().pop().unwrap_or_default()
    }

    /// Returns a buffer for the next segment; beyond what a pipeline of every pool thread
    /// keeps in flight, buffers are freed.
    pub fn give(&self, buf: Vec<u8>) {
        let keep = crate::pool::num_threads() * SEGMENTS_PER_THREAD + 2;
        let mut free = self.lock();
        if free.len() < keep && buf.capacity() > 0 {
            free.push(buf);
        }
    }

    /// Frees every kept buffer.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.free.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::{split, MIN_SEGMENT_BYTES, SEGMENT_BYTES};

    fn ranges(lengths: &[usize]) -> Vec<(usize, usize)> {
        let mut at = 0;
        lengths
            .iter()
            .map(|&n| {
                at += n;
                (at - n, at)
            })
            .collect()
    }

    #[test]
    fn segments_cover_every_record_once_in_order() {
        for (lengths, threads) in [
            (vec![12 << 10; 5000], 2),
            (vec![12 << 10; 7], 16),
            (vec![1 << 20; 3], 4),
            (vec![0; 10], 2),
            ((0..3000).map(|i| i * 37 % 9000).collect(), 3),
        ] {
            let r = ranges(&lengths);
            let segs = split(&r, threads);
            let mut next = 0;
            for s in &segs {
                assert_eq!(s.start, next);
                assert!(s.end > s.start);
                let bytes: usize = r[s.clone()].iter().map(|&(a, b)| b - a).sum();
                // Only a segment's last record may take it past the target.
                let before: usize = r[s.start..s.end - 1].iter().map(|&(a, b)| b - a).sum();
                assert!(before < SEGMENT_BYTES.max(MIN_SEGMENT_BYTES), "{bytes}");
                next = s.end;
            }
            assert_eq!(next, lengths.len());
        }
        assert!(split(&[], 4).is_empty());
    }
}
