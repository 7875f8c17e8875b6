//! Per-record compression: plain zstd at level 3, and zstd at level 19 against the store's
//! trained dictionary. Each thread keeps one level-3 context for good; a worker makes its
//! dictionary context once per append; the prepared dictionaries are immutable and shared.
// Decoders of bytes from files: no panicking shortcuts (docs/FORMAT.md is the contract).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::cell::RefCell;
use std::io;
use std::sync::OnceLock;

use zstd::bulk::Compressor;
use zstd::dict::{DecoderDictionary, EncoderDictionary};
use zstd_safe::DCtx;

use crate::format::Codec;

/// zstd level of the plain codec.
pub const ZSTD_LEVEL: i32 = 3;
/// zstd level of the dictionary codec.
pub const ZSTD_DICT_LEVEL: i32 = 19;

/// A trained dictionary. The decoding side is prepared when the store opens (cheap: a copy and
/// its entropy tables); the encoding side, which at level 19 costs seconds for a dictionary of
/// megabytes, only when a handle first compresses with it.
pub struct Dictionary {
    raw: Vec<u8>,
    encoder: OnceLock<Option<EncoderDictionary<'static>>>,
    decoder: DecoderDictionary<'static>,
}

impl Dictionary {
    /// Prepares the raw bytes of `dict.zr` for decoding; `None` when zstd rejects them.
    pub fn new(raw: Vec<u8>) -> Option<Self> {
        // The zstd crate's constructors panic when zstd refuses a dictionary, so the bytes are
        // first tried through zstd-safe's fallible one.
        zstd_safe::DDict::try_create(&raw)?;
        let decoder = DecoderDictionary::copy(&raw);
        Some(Dictionary { raw, encoder: OnceLock::new(), decoder })
    }

    /// The bytes as stored in `dict.zr`.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The encoding side, prepared on first use; `None` when zstd rejects the dictionary.
    fn encoder(&self) -> Option<&EncoderDictionary<'static>> {
        self.encoder
            .get_or_init(|| {
                zstd_safe::CDict::try_create(&self.raw, ZSTD_DICT_LEVEL)?;
                Some(EncoderDictionary::copy(&self.raw, ZSTD_DICT_LEVEL))
            })
            .as_ref()
    }
}

/// Trains a dictionary of at most `max_size` bytes on `samples`, the concatenation of samples
/// whose sizes are `sizes`, on the compute pool's number of threads.
pub fn train(samples: &[u8], sizes: &[usize], max_size: usize) -> io::Result<Vec<u8>> {
    crate::dict_training::train(samples, sizes, max_size, crate::pool::num_threads())
}

thread_local! {
    /// The calling thread's level-3 context and whether it writes zstd's content checksum,
    /// kept for good: making a context (megabytes of tables, faulted in fresh) per append or
    /// per shard cost more than compressing a small append. Pool threads live as long as the
    /// process, so each makes one. A forked child inherits its forking thread's, which is safe
    /// to go on using (a context holds no locks).
    static PLAIN: RefCell<Option<(Compressor<'static>, bool)>> = const { RefCell::new(None) };
}

/// One worker's compression: the thread's plain context ([`PLAIN`]) and a dictionary context
/// made on first use (the prepared dictionary is shared; a context against it is not).
pub struct Encoder<'d> {
    with_dict: Option<Compressor<'d>>,
    dict: Option<&'d Dictionary>,
    checksum: bool,
}

impl<'d> Encoder<'d> {
    /// With `checksum`, frames carry zstd's content checksum (4 bytes), which every decoder
    /// verifies.
    pub fn new(dict: Option<&'d Dictionary>, checksum: bool) -> Self {
        Encoder { with_dict: None, dict, checksum }
    }

    /// Compresses `src` straight into `dst` if that makes the record smaller: `Some(n)` when
    /// the frame is `dst[..n]`, `None` when the record is to be stored raw (nothing written
    /// that counts). `dst` needs at least `src.len() - 1` bytes.
    ///
    /// zstd gets one byte less room than the input: a frame that would not shrink the record
    /// does not fit, and zstd then says "destination too small" instead of writing it. It
    /// compresses a block before it knows whether the room suffices, so the decision costs
    /// nothing beyond the one compression.
    pub fn encode_into(
        &mut self,
        codec: Codec,
        src: &[u8],
        dst: &mut [u8],
    ) -> io::Result<Option<usize>> {
        if codec == Codec::Raw || src.len() < 2 {
            return Ok(None);
        }
        let room = dst
            .get_mut(..src.len() - 1)
            .ok_or_else(|| io::Error::other("compression output buffer too small"))?;
        if codec == Codec::Zstd {
            return self.plain(src, room);
        }
        if self.with_dict.is_none() {
            let dict = self.dict.ok_or_else(|| io::Error::other("no dictionary"))?;
            let prepared = dict
                .encoder()
                .ok_or_else(|| io::Error::other("zstd rejects the store's dictionary"))?;
            let mut ctx = Compressor::with_prepared_dictionary(prepared)?;
            if self.checksum {
                ctx.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
            }
            self.with_dict = Some(ctx);
        }
        let ctx =
            self.with_dict.as_mut().ok_or_else(|| io::Error::other("no dictionary context"))?;
        Ok(ctx.compress_to_buffer(src, room).ok())
    }

    /// Level 3 on the calling thread's context; `None` when the frame does not fit `room`.
    fn plain(&self, src: &[u8], room: &mut [u8]) -> io::Result<Option<usize>> {
        PLAIN.with(|cell| {
            // Only this function borrows it, and nothing it calls compresses.
            let mut slot = cell.try_borrow_mut().map_err(io::Error::other)?;
            if slot.is_none() {
                *slot = Some((Compressor::new(ZSTD_LEVEL)?, false));
            }
            let Some((ctx, checksum)) = slot.as_mut() else {
                return Err(io::Error::other("no compression context"));
            };
            if *checksum != self.checksum {
                ctx.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(self.checksum))?;
                *checksum = self.checksum;
            }
            Ok(ctx.compress_to_buffer(src, room).ok())
        })
    }
}

thread_local! {
    /// The calling thread's decompression context, reused by every record and every call it
    /// decodes: making one (and freeing it) costs about as much as decoding a small record.
    /// A forked child inherits its forking thread's, which is safe to go on using (a context
    /// holds no locks).
    static CONTEXT: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
}

/// Decodes records, on the calling thread's reused context (see `CONTEXT`).
pub struct Decoder<'d> {
    dict: Option<&'d Dictionary>,
}

impl<'d> Decoder<'d> {
    /// `dict` is the store's dictionary, for `zstd_dict` records.
    pub fn new(dict: Option<&'d Dictionary>) -> Self {
        Decoder { dict }
    }

    /// Decompresses one frame straight into `dst`, which must come out exactly full. `Ok(false)`
    /// means a `zstd_dict` frame with no dictionary to read it.
    pub fn decode(&mut self, codec: Codec, src: &[u8], dst: &mut [u8]) -> io::Result<bool> {
        let ddict = match codec {
            Codec::Raw => {
                if src.len() != dst.len() {
                    return Err(io::Error::other(
                        "raw record with differing stored and logical sizes",
                    ));
                }
                copy_bytes(dst, src);
                return Ok(true);
            }
            Codec::Zstd => None,
            Codec::ZstdDict => match self.dict {
                None => return Ok(false),
                Some(d) => Some(d.decoder.as_ddict()),
            },
        };
        let n = CONTEXT.with(|cell| -> io::Result<usize> {
            // Only this function borrows it, and nothing it calls decodes: never busy. (A
            // fresh context would still be correct if it were.)
            let mut slot = cell.try_borrow_mut().map_err(io::Error::other)?;
            if slot.is_none() {
                *slot = Some(
                    DCtx::try_create()
                        .ok_or_else(|| io::Error::other("zstd could not make a context"))?,
                );
            }
            let Some(ctx) = slot.as_mut() else {
                return Err(io::Error::other("no decompression context"));
            };
            let result = match ddict {
                None => ctx.decompress(dst, src),
                Some(ddict) => ctx.decompress_using_ddict(dst, src, ddict),
            };
            result.map_err(|code| io::Error::other(zstd_safe::get_error_name(code)))
        })?;
        if n != dst.len() {
            return Err(io::Error::other(format!(
                "frame decoded to {n} bytes, the table says {}",
                dst.len()
            )));
        }
        Ok(true)
    }
}

/// Copies a raw record. `memcpy` copies large blocks with `rep movsb`, which some CPUs run
/// several times slower when the destination sits 1 to 31 bytes past the source within a
/// 64-byte line -- a common case here: records sit page-aligned in a chunk, while `NumPy`'s
/// arrays start at any multiple of 16 bytes. Such copies go in 256-byte blocks instead, as fast
/// whatever the alignment; the opaque use of each block keeps the optimizer from fusing the
/// loop back into one `memcpy`. Small records keep `memcpy` (its vector path). The
/// measurements behind the rule and its thresholds: README.md, "Benchmarks" (the copy routine).
#[inline]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    // Labels and other scalars: a move of a known size instead of a call to `memmove`.
    if src.len() <= 16
        && (copy_fixed::<8>(dst, src) || copy_fixed::<4>(dst, src) || copy_fixed::<16>(dst, src))
    {
        return;
    }
    let distance = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) % 64;
    if src.len() < 2048 || distance == 0 || distance >= 32 {
        dst.copy_from_slice(src);
        return;
    }
    let (dst_blocks, dst_tail) = dst.as_chunks_mut::<256>();
    let (src_blocks, src_tail) = src.as_chunks::<256>();
    for (d, s) in dst_blocks.iter_mut().zip(src_blocks) {
        *d = *s;
        std::hint::black_box(&mut *d);
    }
    dst_tail.copy_from_slice(src_tail);
}

/// Copies `src` into `dst` when both are exactly `N` bytes long; false otherwise.
#[inline]
fn copy_fixed<const N: usize>(dst: &mut [u8], src: &[u8]) -> bool {
    match (<&mut [u8; N]>::try_from(dst), <&[u8; N]>::try_from(src)) {
        (Ok(d), Ok(s)) => {
            *d = *s;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::copy_bytes;

    /// Every source/destination distance within a cache line, at sizes on both sides of the
    /// thresholds that pick `memcpy` or the block loop, against a byte-by-byte reference; the
    /// bytes around the destination range must stay untouched.
    #[test]
    fn one_thread_decodes_plain_and_dictionary_frames_in_any_order() {
        // The thread's one context serves both codecs in turn: a frame decoded against the
        // dictionary must not leave it attached for the next plain frame, nor the reverse.
        use super::{Codec, Decoder, Dictionary, Encoder};
        let dict_bytes: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let dict = Dictionary::new(dict_bytes).unwrap();
        let records: Vec<Vec<u8>> =
            (0..6u32).map(|k| (0..1000u32).map(|i| ((i + k) % 251) as u8).collect()).collect();
        let mut encoder = Encoder::new(Some(&dict), false);
        let mut frames = Vec::new();
        for (k, r) in records.iter().enumerate() {
            let codec = if k % 2 == 0 { Codec::Zstd } else { Codec::ZstdDict };
            let mut out = vec![0u8; r.len()];
            let n = encoder.encode_into(codec, r, &mut out).unwrap().unwrap();
            out.truncate(n);
            frames.push((codec, out));
        }
        for _ in 0..2 {
            let mut decoder = Decoder::new(Some(&dict));
            for ((codec, frame), want) in frames.iter().zip(&records) {
                let mut got = vec![0u8; want.len()];
                assert!(decoder.decode(*codec, frame, &mut got).unwrap());
                assert_eq!(&got, want);
            }
        }
        // A dictionary frame with no dictionary is reported, not decoded wrong.
        let mut got = vec![0u8; 1000];
        assert!(!Decoder::new(None).decode(Codec::ZstdDict, &frames[1].1, &mut got).unwrap());
    }

    /// A record that does not shrink comes back raw, decided by the one compression; the
    /// thread's reused context then writes exactly the frame a fresh context writes, with and
    /// without zstd's checksum.
    #[test]
    fn raw_when_not_shrinking_and_the_reused_context_writes_fresh_frames() {
        use super::{Codec, Encoder, ZSTD_LEVEL};
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..12_288)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let ramp: Vec<u8> = (0..12_288u32).map(|i| (i / 7 % 64) as u8).collect();
        for checksum in [false, true, false] {
            let mut encoder = Encoder::new(None, checksum);
            let mut out = vec![0u8; 12_288];
            assert_eq!(encoder.encode_into(Codec::Zstd, &noise, &mut out).unwrap(), None);
            assert_eq!(encoder.encode_into(Codec::Zstd, &[7], &mut out).unwrap(), None);
            let n = encoder.encode_into(Codec::Zstd, &ramp, &mut out).unwrap().unwrap();
            let mut fresh = zstd::bulk::Compressor::new(ZSTD_LEVEL).unwrap();
            fresh.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(checksum)).unwrap();
            assert_eq!(out[..n], fresh.compress(&ramp).unwrap()[..], "checksum={checksum}");
            // Too little room for even the compressible record is an error, not a panic.
            assert!(encoder.encode_into(Codec::Zstd, &ramp, &mut out[..10]).is_err());
        }
    }

    #[test]
    fn copy_bytes_matches_a_bytewise_copy_at_every_distance() {
        let src: Vec<u8> =
            (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 3, 4, 8, 15, 16, 17, 255, 2047, 2048, 2049, 4096, 4096 + 257, 12_288] {
            for src_at in [0, 5, 16, 64] {
                for dst_at in 0..64 {
                    let mut dst = vec![0xA5u8; len + 128];
                    copy_bytes(&mut dst[dst_at..dst_at + len], &src[src_at..src_at + len]);
                    assert_eq!(
                        &dst[dst_at..dst_at + len],
                        &src[src_at..src_at + len],
                        "{len} {src_at} {dst_at}"
                    );
                    assert!(dst[..dst_at].iter().chain(&dst[dst_at + len..]).all(|&b| b == 0xA5));
                }
            }
        }
    }
}
