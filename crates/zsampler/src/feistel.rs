//! The keyed permutation behind cyclic mode: a small Feistel network over the next power of two
//! at or above the index space, brought back into range by cycle-walking.
//!
//! # Construction
//!
//! Let `n` be the length and `k = max(8, ceil(log2(n)))`, so the domain `[0, 2^k)` holds the
//! index space and, for `n > 128`, `2^k < 2n`. The floor of 8 bits is for quality: a Feistel
//! network over a handful of bits reaches only a sliver of the permutations (over 2 or 3 bits the
//! orders of a 3- or 5-record cycle are visibly uneven), while over 8 bits the walked permutation
//! of even 2 or 3 records is uniform within measurement. It costs up to `256 / n` Feistel passes
//! per index for `n < 128`, and since cyclic batches hold at most `n` indices, a batch then costs at
//! most about 256 passes. A value `x` of the domain is split into a high
//! part of `a = k / 2` bits and a low part of `b = k - a` bits (unbalanced by one bit when `k` is
//! odd). Each of the [`ROUNDS`] rounds maps `(hi, lo)` to `(lo ^ F_r(hi), hi)`, the widths
//! swapping with the halves; after the (even number of) rounds the result packs as
//! `(hi << b) | lo`. A round is invertible whatever `F_r` is, so the network is a bijection of
//! `[0, 2^k)`.
//!
//! The round functions take a per-round key `x_r` and a per-round odd multiplier `m_r` and return
//! `w` bits, `w` being the width of the half they are xored into:
//!
//! * `k <= 32` (narrow; both halves have at most 16 bits): with
//!   `u = (v * 0x9E37 mod 2^16) ^ x_r` and the exact 32-bit product `p = u * m_r`,
//!   `F_r(v) = ((p >> 16) ^ (p mod 2^16)) >> (16 - w)`: the high and low halves of the product
//!   folded together, top `w` bits kept. `x_r` is the low 16 bits of its round key and `m_r` the
//!   low 16 bits of its key with the top bit also set. The first multiplication spreads a short
//!   input over all 16 bits before the key is mixed in; without it, inputs of a few bits leave
//!   the round nearly affine and a few percent of the keys give visibly structured permutations.
//!   Everything fits 16-bit lanes, which is what lets compilers run eight positions per vector
//!   instruction on baseline x86-64 (SSE2) and on aarch64.
//! * `k > 32` (wide): `F_r(v) = ((v ^ x_r) * m_r mod 2^64) >> (64 - w)`, multiply-shift hashing
//!   with the full 64-bit keys (inputs have at least 16 bits there).
//!
//! The round keys are `x_r = s_{2r}` and `m_r = s_{2r+1} | 1` for the `SplitMix64` stream `s` of
//! [`crate::mix::stream`] started at the cycle key `derive(mix64(seed ^ SALT_CYCLIC), cycle)`.
//!
//! Why [`ROUNDS`] = 6 and not the textbook four: the Luby-Rackoff bounds speak of far fewer
//! queries than a shuffle makes (every position of the domain), and with four rounds consecutive
//! positions, which share their high half, come out visibly related (in the xor and gaps of
//! consecutive outputs, and in pair frequencies over many cycles) even with ideal round
//! functions. Six rounds of the functions above measure like six rounds of ideal (hash-based)
//! ones on those statistics, on adjacent correlation and on position uniformity over cycles, for
//! all but about one key in a thousand, which still shows some structure in the xor of
//! consecutive outputs of small domains (a few thousand records); eight rounds remove that too,
//! at a third more cost, which the sampler's speed budget does not leave room for.
//!
//! # Cycle-walking
//!
//! For `q < n`, the cyclic index is the first of `P(q), P(P(q)), ...` that lies below `n`. That
//! terminates because `P` is a bijection of a finite set: the orbit of `q` returns to `q`, which is
//! below `n`. Restricted to `[0, n)`, walking is itself a bijection of `[0, n)`. The expected number
//! of applications is `2^k / n`: below 2 for `n > 128`.
//!
//! Nothing of size `n` is ever built: a permutation is a handful of `u64` keys.

use crate::mix::{derive, stream, SALT_CYCLIC};

/// Feistel rounds (even, so the halves end where they started).
pub const ROUNDS: usize = 6;

const _: () = assert!(ROUNDS.is_multiple_of(2) && ROUNDS >= 2);

/// The keyed permutation of one cycle of one sampler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permutation {
    length: u64,
    /// Width `k` of the domain `[0, 2^k)`.
    bits: u32,
    /// Width of the initial high half.
    wa: u32,
    /// Width of the initial low half.
    wb: u32,
    xk: [u64; ROUNDS],
    mk: [u64; ROUNDS],
}

/// The smallest Feistel domain, `2^8`: see the module documentation.
pub const MIN_BITS: u32 = 8;

/// Domain width for an index space of `length` (`length >= 1`): `max(8, ceil(log2(length)))`.
pub fn domain_bits(length: u64) -> u32 {
    let ceil_log2 = if length <= 1 { 0 } else { 64 - (length - 1).leading_zeros() };
    ceil_log2.max(MIN_BITS)
}

/// Wide round function (domain above 32 bits): the top `64 - shift` bits of `(v ^ x) * m`.
#[inline(always)]
fn round_wide(v: u64, x: u64, m: u64, shift: u32) -> u64 {
    (v ^ x).wrapping_mul(m) >> shift
}

/// Spreads a narrow round input over all 16 bits before the key is mixed in (odd, so a bijection).
const SPREAD: u16 = 0x9E37;

/// Narrow round function (domain of at most 32 bits): the folded 32-bit product of
/// `((v * SPREAD mod 2^16) ^ x) * m`, top `16 - shift` bits kept.
#[inline(always)]
fn round_narrow(v: u16, x: u16, m: u16, shift: u32) -> u16 {
    let u = v.wrapping_mul(SPREAD) ^ x;
    let high = ((u32::from(u) * u32::from(m)) >> 16) as u16;
    let low = u.wrapping_mul(m);
    (high ^ low) >> shift
}

/// Entries produced per inner block: the scratch arrays below live on the stack.
const CHUNK: usize = 256;

/// Round keys in the width one network uses, and the shift of each round's function.
#[derive(Clone, Copy)]
struct Keys<T> {
    x: [T; ROUNDS],
    m: [T; ROUNDS],
    shift: [u32; ROUNDS],
}

impl Permutation {
    /// The permutation used by cycle `cycle` of a cyclic sampler over `length` indices seeded with
    /// `seed`. `length` must be at least 1 (it is clamped to 1 otherwise).
    pub fn new(length: u64, seed: u64, cycle: u64) -> Self {
        Self::from_key(length, derive(crate::mix::mix64(seed ^ SALT_CYCLIC), cycle))
    }

    /// The permutation for an already derived cycle key.
    pub(crate) fn from_key(length: u64, key: u64) -> Self {
        let length = length.max(1);
        let bits = domain_bits(length);
        let wa = bits / 2;
        let wb = bits - wa;
        let xk = std::array::from_fn(|r| stream(key, 2 * r as u64));
        let mk = std::array::from_fn(|r| stream(key, 2 * r as u64 + 1) | 1);
        Self { length, bits, wa, wb, xk, mk }
    }

    /// The index space length `n`.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Width `k` of the Feistel domain `[0, 2^k)`.
    pub fn domain_bits(&self) -> u32 {
        self.bits
    }

    /// One pass of the Feistel network over the whole domain `[0, 2^k)`: a bijection of it.
    /// Bits of `x` above the domain are ignored.
    #[inline]
    pub fn feistel(&self, x: u64) -> u64 {
        if self.bits <= 32 {
            u64::from(self.feistel_narrow(&self.narrow_keys(), (x & low_mask(self.bits)) as u32))
        } else {
            self.feistel_wide(&self.wide_keys(), x)
        }
    }

    /// The cycle-walked permutation of `[0, n)`: the index at position `q` of the cycle.
    /// `q` must be below `n`.
    #[inline]
    pub fn index(&self, q: u64) -> u64 {
        debug_assert!(q < self.length);
        let mut x = self.feistel(q);
        while x >= self.length {
            x = self.feistel(x);
        }
        x
    }

    /// Write the indices at positions `q0, q0 + 1, ...` of the cycle into `out`: the same values
    /// as [`Permutation::index`]. `q0 + out.len()` must not exceed `n`.
    pub fn fill(&self, q0: u64, out: &mut [u64]) {
        if self.bits <= 32 {
            self.fill_narrow(q0, out);
        } else {
            self.fill_wide(q0, out);
        }
    }

    /// Round `r` produces a value as wide as the half it is xored into: the initial low half
    /// (`b` bits) for even `r`, the initial high half (`a` bits) for odd `r`.
    fn shifts(&self, word: u32) -> [u32; ROUNDS] {
        std::array::from_fn(|r| word - if r % 2 == 0 { self.wb } else { self.wa })
    }

    /// The narrow multipliers get their top bit set as well: a multiplier below 2^15 leaves the
    /// high half of the product short of bits, and one as small as 1 makes a round near linear.
    fn narrow_keys(&self) -> Keys<u16> {
        Keys {
            x: self.xk.map(|k| k as u16),
            m: self.mk.map(|k| k as u16 | 0x8000),
            shift: self.shifts(16),
        }
    }

    fn wide_keys(&self) -> Keys<u64> {
        Keys { x: self.xk, m: self.mk, shift: self.shifts(64) }
    }

    /// [`Permutation::feistel`] for `k <= 32`, in 16-bit halves.
    #[inline(always)]
    fn feistel_narrow(&self, keys: &Keys<u16>, x: u32) -> u32 {
        let wb = self.wb;
        let (hi, lo) = rounds_narrow(keys, (x >> wb) as u16, (x as u16) & (low_mask(wb) as u16));
        (u32::from(hi) << wb) | u32::from(lo)
    }

    /// [`Permutation::feistel`] for `k > 32`, in 64-bit arithmetic.
    #[inline(always)]
    fn feistel_wide(&self, keys: &Keys<u64>, x: u64) -> u64 {
        let wb = self.wb;
        let mut hi = (x >> wb) & low_mask(self.wa);
        let mut lo = x & low_mask(wb);
        for r in 0..ROUNDS {
            (hi, lo) = (lo ^ round_wide(hi, keys.x[r], keys.m[r], keys.shift[r]), hi);
        }
        (hi << wb) | lo
    }

    // Both fills exploit that consecutive positions share the high half for runs of 2^b, so
    // round 0, whose function reads only the high half, is evaluated once per run rather than once
    // per index. The narrow fill keeps its rounds in 16-bit lanes with no branches, which compilers
    // vectorize even for baseline x86-64. Cycle-walking then runs on a compacted list of the
    // entries that landed at or above n, one Feistel pass over the whole list at a time, so an
    // unpredictable in/out-of-range pattern costs few branch mispredictions.

    /// The narrow fill, in the widest vectors the CPU offers: the same code compiled for each
    /// instruction set (see [`fill_narrow_in`]), so every path writes the same values.
    fn fill_narrow(&self, q0: u64, out: &mut [u64]) {
        #[cfg(target_arch = "x86_64")]
        x86::fill_narrow(self, q0, out);
        #[cfg(not(target_arch = "x86_64"))]
        fill_narrow_in::<8>(self, q0, out);
    }

    fn fill_wide(&self, q0: u64, out: &mut [u64]) {
        let keys = self.wide_keys();
        let wb = self.wb;
        let mask_b = low_mask(wb);
        let n = self.length;
        let mut q = q0;
        let mut at = [0u16; CHUNK];
        for chunk in out.chunks_mut(CHUNK) {
            let mut done = 0usize;
            while done < chunk.len() {
                let hi = q >> wb;
                let lo0 = q & mask_b;
                // b <= 32, so the run length fits in usize.
                let take = ((mask_b - lo0) as usize).saturating_add(1).min(chunk.len() - done);
                let f0 = round_wide(hi, keys.x[0], keys.m[0], keys.shift[0]);
                for (i, slot) in chunk[done..done + take].iter_mut().enumerate() {
                    let (mut a, mut b) = ((lo0 + i as u64) ^ f0, hi);
                    for r in 1..ROUNDS {
                        (a, b) = (b ^ round_wide(a, keys.x[r], keys.m[r], keys.shift[r]), a);
                    }
                    *slot = (a << wb) | b;
                }
                done += take;
                q += take as u64;
            }
            let mut count = 0usize;
            for (i, &v) in chunk.iter().enumerate() {
                at[count % CHUNK] = i as u16;
                count += usize::from(v >= n);
            }
            while count > 0 {
                let mut still = 0usize;
                for k in 0..count {
                    let i = usize::from(at[k]);
                    let v = self.feistel_wide(&keys, chunk[i]);
                    chunk[i] = v;
                    at[still] = at[k];
                    still += usize::from(v >= n);
                }
                count = still;
            }
        }
    }
}

/// [`Permutation::fill`] for `k <= 32`. `LANES` is the number of 16-bit lanes of the vectors it is
/// compiled for: the walk passes round their list up to a multiple of it.
#[inline(always)]
#[expect(clippy::many_single_char_names, reason = "the cipher's usual notation")]
fn fill_narrow_in<const LANES: usize>(p: &Permutation, q0: u64, out: &mut [u64]) {
    let keys = p.narrow_keys();
    let wb = p.wb;
    let mask_b = low_mask(wb) as u16;
    // k <= 32: positions and domain values are pairs of 16-bit halves (hi, lo), and a value
    // lies outside [0, n) when its pair compares above that of n - 1.
    let last = p.length - 1;
    let (last_hi, last_lo) = ((last >> wb) as u16, (last as u16) & mask_b);
    let outside = |h: u16, l: u16| (h > last_hi) || (h == last_hi) && (l > last_lo);
    let mut q = q0;
    // The halves of each result, kept apart so the rounds run in 16-bit lanes, their
    // out-of-range flags, and the walk list: positions and halves of the pending entries.
    let mut his = [0u16; CHUNK];
    let mut los = [0u16; CHUNK];
    let mut over = [0u8; CHUNK];
    let mut at = [0u16; CHUNK];
    let mut pend_hi = [0u16; CHUNK];
    let mut pend_lo = [0u16; CHUNK];
    for chunk in out.chunks_mut(CHUNK) {
        let len = chunk.len();
        let mut done = 0usize;
        while done < len {
            let hi = (q >> wb) as u16;
            let lo0 = (q as u16) & mask_b;
            let take = (usize::from(mask_b - lo0) + 1).min(len - done);
            let f0 = round_narrow(hi, keys.x[0], keys.m[0], keys.shift[0]);
            let run = his[done..done + take].iter_mut().zip(los[done..done + take].iter_mut());
            for (i, (h, l)) in run.enumerate() {
                let (mut a, mut b) = ((lo0 + i as u16) ^ f0, hi);
                for r in 1..ROUNDS {
                    (a, b) = (b ^ round_narrow(a, keys.x[r], keys.m[r], keys.shift[r]), a);
                }
                *h = a;
                *l = b;
            }
            done += take;
            q += take as u64;
        }
        for (o, (&h, &l)) in over[..len].iter_mut().zip(his.iter().zip(los.iter())) {
            *o = u8::from(outside(h, l));
        }
        // Cycle-walk the entries that landed outside: list them from a bit mask per 64
        // entries, then run whole Feistel passes over the list until it is empty.
        let mut count = 0usize;
        for (b, block) in over[..len].chunks(64).enumerate() {
            let mut mask = flag_mask(block);
            while mask != 0 {
                let i = b * 64 + mask.trailing_zeros() as usize;
                at[count % CHUNK] = i as u16;
                pend_hi[count % CHUNK] = his[i];
                pend_lo[count % CHUNK] = los[i];
                count += 1;
                mask &= mask - 1;
            }
        }
        while count > 0 {
            // Whole vectors: the lanes past `count` hold stale values, computed and ignored.
            let lanes = count.next_multiple_of(LANES).min(CHUNK);
            let pend = pend_hi[..lanes].iter_mut().zip(pend_lo[..lanes].iter_mut());
            for (h, l) in pend {
                (*h, *l) = rounds_narrow(&keys, *h, *l);
            }
            let mut still = 0usize;
            for k in 0..count {
                let (i, h, l) = (usize::from(at[k]), pend_hi[k], pend_lo[k]);
                // Written even when still outside: a later pass overwrites it.
                his[i] = h;
                los[i] = l;
                at[still] = at[k];
                pend_hi[still] = h;
                pend_lo[still] = l;
                still += usize::from(outside(h, l));
            }
            count = still;
        }
        for (o, (&h, &l)) in chunk.iter_mut().zip(his.iter().zip(los.iter())) {
            *o = (u64::from(h) << wb) | u64::from(l);
        }
    }
}

/// Runtime dispatch of the narrow fill on x86-64: the build targets baseline x86-64, where the
/// 16-bit lanes of the rounds fill 128-bit SSE2 vectors; CPUs with AVX-512BW run the same code
/// compiled for 512-bit vectors. Integer arithmetic only, so the values do not depend on the path.
///
/// There is no AVX2 path: compiled for 256-bit vectors, the rounds lose their high-half products
/// to widening and repacking and measured no faster than SSE2 (AMD EPYC, 1M indices).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{fill_narrow_in, Permutation};
    use std::sync::atomic::{AtomicU8, Ordering};

    const UNKNOWN: u8 = 0;
    const BASELINE: u8 = 1;
    const AVX512: u8 = 2;

    /// The widest usable instruction set, detected once.
    static LEVEL: AtomicU8 = AtomicU8::new(UNKNOWN);

    fn level() -> u8 {
        match LEVEL.load(Ordering::Relaxed) {
            UNKNOWN => {
                let level =
                    if std::is_x86_feature_detected!("avx512bw") { AVX512 } else { BASELINE };
                LEVEL.store(level, Ordering::Relaxed);
                level
            }
            level => level,
        }
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    fn fill_narrow_avx512(p: &Permutation, q0: u64, out: &mut [u64]) {
        fill_narrow_in::<32>(p, q0, out);
    }

    /// [`Permutation::fill`] for `k <= 32` in the widest vectors the CPU supports.
    #[expect(
        unsafe_code,
        reason = "calls the AVX-512BW build of the loop after checking the CPU has it"
    )]
    pub(super) fn fill_narrow(p: &Permutation, q0: u64, out: &mut [u64]) {
        match level() {
            // SAFETY: `level` returns AVX512 only when AVX-512F/BW were detected at runtime.
            AVX512 => unsafe { fill_narrow_avx512(p, q0, out) },
            _ => fill_narrow_in::<8>(p, q0, out),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        #[expect(unsafe_code, reason = "runs the AVX-512BW path directly when the CPU has it")]
        fn every_path_writes_the_same_values() {
            if !std::is_x86_feature_detected!("avx512bw") {
                return;
            }
            for &(n, q0, len) in
                &[(1u64, 0u64, 1usize), (3, 0, 3), (1000, 17, 900), (1 << 20, 5, 3000)]
            {
                for seed in 0..4 {
                    let p = Permutation::new(n, seed, 1);
                    let (mut base, mut wide) = (vec![0u64; len], vec![0u64; len]);
                    fill_narrow_in::<8>(&p, q0, &mut base);
                    // SAFETY: AVX-512F/BW were detected at runtime just above.
                    unsafe { fill_narrow_avx512(&p, q0, &mut wide) };
                    assert_eq!(base, wide, "n={n} seed={seed}");
                }
            }
        }
    }
}

/// All the narrow rounds on the halves `(hi, lo)` of a domain value.
#[inline(always)]
fn rounds_narrow(keys: &Keys<u16>, mut hi: u16, mut lo: u16) -> (u16, u16) {
    for r in 0..ROUNDS {
        (hi, lo) = (lo ^ round_narrow(hi, keys.x[r], keys.m[r], keys.shift[r]), hi);
    }
    (hi, lo)
}

/// Bit `i` set where `flags[i]` is 1, for up to 64 flags that are each 0 or 1.
#[inline(always)]
fn flag_mask(flags: &[u8]) -> u64 {
    let mut mask = 0u64;
    let words = flags.chunks_exact(8);
    let tail = words.remainder();
    for (k, bytes) in words.enumerate() {
        let word = u64::from_le_bytes(bytes.try_into().expect("chunks of 8"));
        // Byte j (0 or 1) of the word lands on bit 56 + j: the shifts 56 - 7j never collide.
        mask |= (word.wrapping_mul(0x0102_0408_1020_4080) >> 56) << (8 * k);
    }
    let base = flags.len() - tail.len();
    for (j, &flag) in tail.iter().enumerate() {
        mask |= u64::from(flag) << (base + j);
    }
    mask
}

/// `2^w - 1` for `w` in `0..=64`.
#[inline(always)]
fn low_mask(w: u32) -> u64 {
    if w >= 64 {
        u64::MAX
    } else {
        (1u64 << w) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_bits_cover_and_stay_tight() {
        assert_eq!(domain_bits(1), MIN_BITS);
        assert_eq!(domain_bits(2), MIN_BITS);
        assert_eq!(domain_bits(256), 8);
        assert_eq!(domain_bits(257), 9);
        assert_eq!(domain_bits(1 << 20), 20);
        assert_eq!(domain_bits((1 << 20) + 1), 21);
        assert_eq!(domain_bits(1 << 63), 63);
        assert_eq!(domain_bits((1 << 63) + 1), 64);
        assert_eq!(domain_bits(u64::MAX), 64);
    }

    #[test]
    fn flag_mask_packs_every_pattern() {
        for bits in 0u32..256 {
            let flags: Vec<u8> = (0..8).map(|j| ((bits >> j) & 1) as u8).collect();
            assert_eq!(flag_mask(&flags), u64::from(bits));
        }
        let mut flags = [0u8; 64];
        for i in [0, 7, 8, 33, 62, 63] {
            flags[i] = 1;
        }
        assert_eq!(flag_mask(&flags), 1 | 1 << 7 | 1 << 8 | 1 << 33 | 1 << 62 | 1 << 63);
        assert_eq!(flag_mask(&flags[..61]), 1 | 1 << 7 | 1 << 8 | 1 << 33);
    }

    #[test]
    fn fill_matches_index() {
        for &n in &[1u64, 2, 3, 7, 255, 256, 257, 1000, 4099] {
            let p = Permutation::new(n, 11, 3);
            let mut out = vec![0u64; n as usize];
            p.fill(0, &mut out);
            for (q, &v) in out.iter().enumerate() {
                assert_eq!(v, p.index(q as u64), "n={n} q={q}");
            }
        }
    }

    #[test]
    fn full_width_domain() {
        let p = Permutation::new(u64::MAX, 5, 0);
        assert_eq!(p.domain_bits(), 64);
        let mut out = [0u64; 600];
        let q0 = u64::MAX - 600;
        p.fill(q0, &mut out);
        for (i, &v) in out.iter().enumerate() {
            assert!(v < u64::MAX);
            assert_eq!(v, p.index(q0 + i as u64));
        }
    }
}
