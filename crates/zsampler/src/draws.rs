//! The records a mixture's source gives for a run of its draws.
//!
//! A mixture (`loaderx.mix`) reads each source in its own keyed permutation per pass over that
//! source: draw `d` of a source of `n` records is element `d mod n` of pass `d / n`'s
//! permutation. The Python layer decides which draws a batch takes; this module turns a run of
//! consecutive draws into records, the per-row work of a mixture, so that it costs a few
//! nanoseconds a row instead of a few dozen `NumPy` calls a block.
//!
//! The orders are a published contract (a resumed run depends on them) and are defined by the
//! reference model in `python/loaderx/_views/mix_plan.py` (`draw_keys`, `permute`,
//! `small_orders`); `tests/test_mixture.py` holds the two equal on both size classes. In short:
//!
//! * the key of pass `p` is `p * PASS_MULTIPLIER ^ base` (wrapping), `base` the source's key;
//! * a source of more than [`SMALL`] records is permuted by a four-round Feistel network on the
//!   two digits `(x / b, x mod b)` of `[0, a * b)` (`a * b >= n`), walked until it lands below `n`;
//! * a smaller source (where two digits would give few distinct orders) sorts `0..n` by the
//!   keyed hash `mix64(key ^ (i + 1) * GOLDEN)` of each element, ties by element.

use fastdivide::DividerU64;

use crate::mix::{mix64, GOLDEN};
use crate::SamplerError;

/// Sources of at most this many records are permuted by sorting hashes.
pub const SMALL: u64 = 64;

/// What a pass number is multiplied by before it is combined with the source's key.
pub const PASS_MULTIPLIER: u64 = 0xD6E8_FEB8_6659_FD93;

/// The Feistel network's round constants.
const ROUND: [u64; 4] =
    [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0x27D4_EB2F_1656_67C5];

/// How far a round's hash is shifted down before it is added to a digit.
const SHIFT: u32 = 29;

/// A digit's range as a divider: a multiply and a shift per division (libdivide's method, the
/// `fastdivide` crate) instead of a division, which costs more than the rest of a round.
#[derive(Clone, Copy)]
struct DigitRange {
    d: u64,
    div: DividerU64,
}

impl DigitRange {
    fn new(d: u64) -> Self {
        DigitRange { d, div: DividerU64::divide_by(d) }
    }

    fn div_rem(self, x: u64) -> (u64, u64) {
        let q = self.div.divide(x);
        (q, x - q * self.d)
    }

    fn rem(self, x: u64) -> u64 {
        self.div_rem(x).1
    }
}

/// One source of a mixture: its length, its permutation domain's digits and its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceOrder {
    n: u64,
    a: u64,
    b: u64,
    base: u64,
}

impl SourceOrder {
    /// A source of `n` records with the domain `[0, a * b)` and the key `base`.
    ///
    /// Fails unless `n >= 1`, `a, b >= 1` and `a * b >= n` (without overflow); the digits of
    /// a small source are not used.
    pub fn new(n: u64, a: u64, b: u64, base: u64) -> Result<Self, SamplerError> {
        if n == 0 {
            return Err(SamplerError::ZeroLength);
        }
        let covers = a.checked_mul(b).is_some_and(|domain| domain >= n);
        if n > SMALL && (a == 0 || b == 0 || !covers) {
            return Err(SamplerError::BadDomain { length: n, a, b });
        }
        Ok(Self { n, a, b, base })
    }

    /// The permutation key of pass `pass`.
    fn key(&self, pass: u64) -> u64 {
        pass.wrapping_mul(PASS_MULTIPLIER) ^ self.base
    }

    /// The keyed bijection of `[0, a * b)` (four rounds, one digit each) of one element.
    fn feistel(x: u64, key: u64, a: DigitRange, b: DigitRange) -> u64 {
        let mut one = [x];
        Self::feistel_lanes(&mut one, key, a, b);
        one[0]
    }

    /// Element `k` (`< n`) of the permutation keyed `key`, for a source of more than
    /// [`SMALL`] records: cycle-walking ends, since the network permutes a domain holding `k`.
    /// Given a `v >= n` the network made of some element, it continues that element's walk.
    fn walk(&self, k: u64, key: u64, a: DigitRange, b: DigitRange) -> u64 {
        let mut y = Self::feistel(k, key, a, b);
        while y >= self.n {
            y = Self::feistel(y, key, a, b);
        }
        y
    }

    /// The whole permutation keyed `key` of a small source (`n` entries).
    fn small_order(&self, key: u64) -> Vec<u64> {
        let mut hashed: Vec<(u64, u64)> =
            (0..self.n).map(|i| (mix64(key ^ (i + 1).wrapping_mul(GOLDEN)), i)).collect();
        hashed.sort_unstable(); // ties (equal hashes) by element, as a stable sort would
        hashed.into_iter().map(|(_, i)| i).collect()
    }

    /// The records of draws `first, first + 1, ...` into `out` (one per entry).
    ///
    /// Fails when the last draw would pass `u64::MAX`.
    pub fn draws_into(&self, first: u64, out: &mut [u64]) -> Result<(), SamplerError> {
        let count = out.len() as u64;
        if first.checked_add(count).is_none() {
            return Err(SamplerError::DrawsOutOfRange { first, count });
        }
        let mut done = 0;
        let mut draw = first;
        while done < out.len() {
            // One pass's stretch of the run: one key.
            let (pass, k) = (draw / self.n, draw % self.n);
            let len = (self.n - k).min((out.len() - done) as u64);
            let stretch = &mut out[done..done + len as usize];
            if self.n <= SMALL {
                self.small_stretch(self.key(pass), k, stretch);
            } else {
                self.large_stretch(self.key(pass), k, stretch);
            }
            done += len as usize;
            draw += len;
        }
        Ok(())
    }

    /// Elements `k, k + 1, ...` of a small source's permutation keyed `key`.
    fn small_stretch(&self, key: u64, k: u64, out: &mut [u64]) {
        let k = k as usize;
        out.copy_from_slice(&self.small_order(key)[k..k + out.len()]);
    }

    /// Elements `k, k + 1, ...` of a large source's permutation keyed `key`, [`LANES`] at a
    /// time: the rounds of neighbouring elements are independent, so the processor overlaps
    /// them (one element's rounds are a chain of multiplies).
    fn large_stretch(&self, key: u64, k: u64, out: &mut [u64]) {
        let (a, b) = (DigitRange::new(self.a), DigitRange::new(self.b));
        let mut next = k;
        let mut chunks = out.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            let mut lanes: [u64; LANES] = std::array::from_fn(|i| next + i as u64);
            Self::feistel_lanes(&mut lanes, key, a, b);
            for (slot, landed) in chunk.iter_mut().zip(lanes) {
                // Rarely past n (a * b - n < a): walk that element on.
                *slot = if landed < self.n { landed } else { self.walk(landed, key, a, b) };
            }
            next += LANES as u64;
        }
        for slot in chunks.into_remainder() {
            *slot = self.walk(next, key, a, b);
            next += 1;
        }
    }

    /// The keyed bijection of `[0, a * b)` of `N` elements in lockstep: four rounds on the
    /// digits `(x / b, x mod b)`, each adding a hash of the other digit modulo its range; `a`
    /// and `b` are the digit ranges as dividers.
    fn feistel_lanes<const N: usize>(x: &mut [u64; N], key: u64, a: DigitRange, b: DigitRange) {
        let mut hi = [0; N];
        let mut lo = [0; N];
        for i in 0..N {
            (hi[i], lo[i]) = b.div_rem(x[i]);
        }
        for (r, c) in ROUND.iter().enumerate() {
            for i in 0..N {
                if r % 2 == 0 {
                    hi[i] = a.rem(hi[i].wrapping_add(((lo[i] ^ key).wrapping_mul(*c)) >> SHIFT));
                } else {
                    lo[i] = b.rem(lo[i].wrapping_add(((hi[i] ^ key).wrapping_mul(*c)) >> SHIFT));
                }
            }
        }
        for i in 0..N {
            x[i] = hi[i].wrapping_mul(b.d).wrapping_add(lo[i]);
        }
    }
}

/// Elements of a large source computed in lockstep.
const LANES: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    fn pass_of(order: &SourceOrder, pass: u64) -> Vec<u64> {
        let mut out = vec![0; usize::try_from(order.n).unwrap()];
        order.draws_into(pass * order.n, &mut out).unwrap();
        out
    }

    #[test]
    fn a_digit_range_divides_exactly() {
        let mut state = 0x1234_5678_9ABC_DEF0u64;
        let mut values = |count: usize| -> Vec<u64> {
            (0..count)
                .map(|_| {
                    state = mix64(state);
                    state >> (state % 64)
                })
                .collect()
        };
        let mut divisors =
            vec![1, 2, 3, 7, 640, 4_294_967_295, 4_294_967_297, 1 << 40, (1 << 63) + 1, u64::MAX];
        divisors.extend(values(200).into_iter().filter(|&d| d > 0));
        for d in divisors {
            let r = DigitRange::new(d);
            let mut xs = vec![0, 1, d - 1, d, d.wrapping_add(1), u64::MAX, u64::MAX - 1];
            xs.extend(values(50));
            for v in xs {
                assert_eq!(r.div_rem(v), (v / d, v % d), "{v} / {d}");
            }
        }
    }

    #[test]
    fn every_pass_is_a_permutation_and_passes_differ() {
        for (n, a, b) in
            [(1, 1, 1), (2, 1, 2), (64, 8, 8), (65, 8, 9), (1000, 25, 40), (997, 31, 33)]
        {
            let order = SourceOrder::new(n, a, b, 12345).unwrap();
            let p0 = pass_of(&order, 0);
            let mut sorted = p0.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n={n}");
            if n > 8 {
                assert_ne!(p0, pass_of(&order, 1), "n={n}");
            }
        }
    }

    #[test]
    fn a_run_across_passes_is_the_passes_joined() {
        for n in [5, 70] {
            let order = SourceOrder::new(n, 7, 11, 99).unwrap();
            let mut run = vec![0; usize::try_from(2 * n).unwrap()];
            order.draws_into(3 * n + 2, &mut run).unwrap();
            let joined: Vec<u64> =
                [pass_of(&order, 3), pass_of(&order, 4), pass_of(&order, 5)].concat();
            let start = 2;
            assert_eq!(run, joined[start..start + run.len()]);
        }
    }

    #[test]
    fn bad_domains_and_ranges_are_refused() {
        assert_eq!(SourceOrder::new(0, 1, 1, 0), Err(SamplerError::ZeroLength));
        assert!(matches!(SourceOrder::new(100, 9, 11, 0), Err(SamplerError::BadDomain { .. })));
        assert!(matches!(SourceOrder::new(100, 0, 200, 0), Err(SamplerError::BadDomain { .. })));
        assert!(matches!(
            SourceOrder::new(100, u64::MAX, 3, 0),
            Err(SamplerError::BadDomain { .. })
        ));
        assert!(SourceOrder::new(10, 0, 0, 0).is_ok()); // a small source has no digits
        let order = SourceOrder::new(100, 10, 10, 0).unwrap();
        let mut out = [0; 2];
        assert!(matches!(
            order.draws_into(u64::MAX, &mut out),
            Err(SamplerError::DrawsOutOfRange { .. })
        ));
    }
}
