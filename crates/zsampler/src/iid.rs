//! IID mode: uniform draws with replacement from a counter-based generator.
//!
//! # Construction
//!
//! A batch key `K = derive(mix64(seed ^ SALT_IID), step)` starts a `SplitMix64` stream
//! `s_i = mix64(K + (i + 1) * GOLDEN)`; nothing is replayed, any batch is computed directly.
//!
//! * `n <= 2^32` (the "narrow" path): each 64-bit word serves two indices. Entry `j` of the batch
//!   takes the low (even `j`) or high (odd `j`) 32 bits `v` of `s_{j / 2}`, and is the high half of
//!   `v * n` (Lemire's multiply-shift), unless the low half of that product falls below
//!   `2^32 mod n`, in which case the draw is rejected.
//! * `n > 2^32` (the "wide" path): entry `j` takes all of `s_j`, and is the high 64 bits of the
//!   128-bit `s_j * n`, rejected when the low 64 bits fall below `2^64 mod n`.
//!
//! A rejected entry `j` redraws from its own stream `r_a = mix64(mix64(R ^ j) + a * GOLDEN)`,
//! `a = 1, 2, ...` with `R = mix64(K ^ SALT_REJECT)`, using the low 32 bits (narrow) or the whole
//! word (wide), until a draw is accepted. Rejection only ever touches entry `j`, so every entry is a
//! pure function of `(seed, step, j)` and the result is exactly uniform on `[0, n)`.

use crate::mix::{derive, mix64, stream, GOLDEN, SALT_IID, SALT_REJECT};

/// The per-sampler IID key.
pub(crate) fn seed_key(seed: u64) -> u64 {
    mix64(seed ^ SALT_IID)
}

/// One redraw for entry `j`, attempt `a >= 1`.
#[inline(never)]
fn redraw(batch_key: u64, j: u64, a: u64) -> u64 {
    let r = mix64(batch_key ^ SALT_REJECT);
    mix64(mix64(r ^ j).wrapping_add(a.wrapping_mul(GOLDEN)))
}

/// Narrow path slow case: redraw entry `j` until accepted.
#[cold]
#[inline(never)]
fn narrow_reject(batch_key: u64, j: u64, n: u64, threshold: u64) -> u64 {
    let mut a = 1u64;
    loop {
        let m = (redraw(batch_key, j, a) & 0xFFFF_FFFF) * n;
        if (m & 0xFFFF_FFFF) >= threshold {
            return m >> 32;
        }
        a += 1;
    }
}

/// Wide path slow case: redraw entry `j` until accepted.
#[cold]
#[inline(never)]
fn wide_reject(batch_key: u64, j: u64, n: u64, threshold: u64) -> u64 {
    let mut a = 1u64;
    loop {
        let m = u128::from(redraw(batch_key, j, a)) * u128::from(n);
        if (m as u64) >= threshold {
            return (m >> 64) as u64;
        }
        a += 1;
    }
}

/// Narrow path, one candidate: `v < 2^32`, `n <= 2^32`.
#[inline(always)]
fn narrow_one(v: u64, n: u64, threshold: u64, batch_key: u64, j: u64) -> u64 {
    let m = v * n;
    if (m & 0xFFFF_FFFF) < threshold {
        narrow_reject(batch_key, j, n, threshold)
    } else {
        m >> 32
    }
}

/// Write entries `start .. start + out.len()` of the IID batch for `(key, step)` over `[0, n)`.
pub(crate) fn fill(key: u64, step: u64, n: u64, start: u64, out: &mut [u64]) {
    let batch_key = derive(key, step);
    if n <= 1 << 32 {
        // 2^32 mod n, computed without 2^32 fitting the operand type of n's narrow case.
        let threshold = ((1u64 << 32) - n) % n;
        let mut j = start;
        // An odd start takes the high half of a word whose low half belongs to entry start - 1.
        let lead = usize::from(j % 2 == 1).min(out.len());
        let (head, rest) = out.split_at_mut(lead);
        if let [first] = head {
            let v = stream(batch_key, j / 2) >> 32;
            *first = narrow_one(v, n, threshold, batch_key, j);
            j += 1;
        }
        let mut pairs = rest.chunks_exact_mut(2);
        for pair in &mut pairs {
            let s = stream(batch_key, j / 2);
            pair[0] = narrow_one(s & 0xFFFF_FFFF, n, threshold, batch_key, j);
            pair[1] = narrow_one(s >> 32, n, threshold, batch_key, j + 1);
            j += 2;
        }
        if let [last] = pairs.into_remainder() {
            let v = stream(batch_key, j / 2) & 0xFFFF_FFFF;
            *last = narrow_one(v, n, threshold, batch_key, j);
        }
    } else {
        let threshold = n.wrapping_neg() % n;
        for (i, slot) in out.iter_mut().enumerate() {
            let j = start + i as u64;
            let m = u128::from(stream(batch_key, j)) * u128::from(n);
            *slot = if (m as u64) < threshold {
                wide_reject(batch_key, j, n, threshold)
            } else {
                (m >> 64) as u64
            };
        }
    }
}
