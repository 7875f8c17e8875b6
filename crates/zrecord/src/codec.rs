//! Per-record compression: plain zstd at level 3, and zstd at level 19 against the store's
//! trained dictionary. Contexts are created once per shard and reused across its records; the
//! prepared dictionaries are immutable and shared by every shard.
// Decoders of bytes from files: no panicking shortcuts (docs/FORMAT.md is the contract).
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::io;
use std::sync::OnceLock;

use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

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

/// One shard's compression contexts and scratch space.
pub struct Encoder<'d> {
    plain: Option<Compressor<'d>>,
    with_dict: Option<Compressor<'d>>,
    dict: Option<&'d Dictionary>,
    scratch: Vec<u8>,
    checksum: bool,
}

impl<'d> Encoder<'d> {
    /// Contexts are made on first use. With `checksum`, frames carry zstd's content checksum
    /// (4 bytes), which every decoder verifies.
    pub fn new(dict: Option<&'d Dictionary>, checksum: bool) -> Self {
        Encoder { plain: None, with_dict: None, dict, scratch: Vec::new(), checksum }
    }

    fn configured(&self, mut ctx: Compressor<'d>) -> io::Result<Compressor<'d>> {
        if self.checksum {
            ctx.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
        }
        Ok(ctx)
    }

    /// Compresses `src` and appends the frame to `out` if that makes the record smaller.
    /// Returns the codec the record is stored with: `codec` when it shrank, [`Codec::Raw`]
    /// otherwise (nothing appended).
    pub fn encode(&mut self, codec: Codec, src: &[u8], out: &mut Vec<u8>) -> io::Result<Codec> {
        if codec == Codec::Raw || src.len() < 2 {
            return Ok(Codec::Raw);
        }
        if codec == Codec::Zstd && self.plain.is_none() {
            self.plain = Some(self.configured(Compressor::new(ZSTD_LEVEL)?)?);
        }
        if codec == Codec::ZstdDict && self.with_dict.is_none() {
            let dict = self.dict.ok_or_else(|| io::Error::other("no dictionary"))?;
            let prepared = dict
                .encoder()
                .ok_or_else(|| io::Error::other("zstd rejects the store's dictionary"))?;
            let ctx = Compressor::with_prepared_dictionary(prepared)?;
            self.with_dict = Some(self.configured(ctx)?);
        }
        let ctx = match codec {
            Codec::Zstd => self.plain.as_mut(),
            _ => self.with_dict.as_mut(),
        }
        .ok_or_else(|| io::Error::other("no compression context for the codec"))?;
        // zstd gets one byte less room than the input: output that would not shrink the record
        // is unwanted, and zstd then reports "destination too small" instead of writing it.
        let room = src.len().saturating_sub(1);
        if self.scratch.len() < room {
            self.scratch.resize(room, 0);
        }
        let scratch = self.scratch.get_mut(..room).unwrap_or_default();
        match ctx.compress_to_buffer(src, scratch) {
            Ok(n) => {
                out.extend_from_slice(scratch.get(..n).unwrap_or_default());
                Ok(codec)
            }
            Err(_) => Ok(Codec::Raw),
        }
    }
}

/// One shard's decompression contexts.
pub struct Decoder<'d> {
    plain: Option<Decompressor<'d>>,
    with_dict: Option<Decompressor<'d>>,
    dict: Option<&'d Dictionary>,
}

impl<'d> Decoder<'d> {
    /// Contexts are made on first use.
    pub fn new(dict: Option<&'d Dictionary>) -> Self {
        Decoder { plain: None, with_dict: None, dict }
    }

    /// Decompresses one frame straight into `dst`, which must come out exactly full. `Ok(false)`
    /// means a `zstd_dict` frame with no dictionary to read it.
    pub fn decode(&mut self, codec: Codec, src: &[u8], dst: &mut [u8]) -> io::Result<bool> {
        let ctx = match codec {
            Codec::Raw => {
                if src.len() != dst.len() {
                    return Err(io::Error::other(
                        "raw record with differing stored and logical sizes",
                    ));
                }
                copy_bytes(dst, src);
                return Ok(true);
            }
            Codec::Zstd => match &mut self.plain {
                Some(c) => c,
                slot => slot.insert(Decompressor::new()?),
            },
            Codec::ZstdDict => match &mut self.with_dict {
                Some(c) => c,
                slot => match self.dict {
                    None => return Ok(false),
                    Some(d) => slot.insert(Decompressor::with_prepared_dictionary(&d.decoder)?),
                },
            },
        };
        let n = ctx.decompress_to_buffer(src, dst)?;
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, reason = "tests")]
mod tests {
    use super::copy_bytes;

    /// Every source/destination distance within a cache line, at sizes on both sides of the
    /// thresholds that pick `memcpy` or the block loop, against a byte-by-byte reference; the
    /// bytes around the destination range must stay untouched.
    #[test]
    fn copy_bytes_matches_a_bytewise_copy_at_every_distance() {
        let src: Vec<u8> =
            (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 255, 2047, 2048, 2049, 4096, 4096 + 257, 12_288] {
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
