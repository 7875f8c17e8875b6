//! The one mixing primitive every mode's keys and draws are built from.
//!
//! Everything the sampler derives goes through [`mix64`], the `SplitMix64` output function (a
//! bijection on `u64`), so the sequences depend on nothing but these constants and that function.
//! Changing any constant here changes the published sequences: the known-answer vectors in
//! `tests/sampler_vectors.json` freeze them.

/// The `SplitMix64` stream increment: 2^64 / golden ratio, rounded to odd.
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Domain separation for the per-mode seed key, so IID and cyclic never share a key stream.
pub const SALT_IID: u64 = 0x6A09_E667_F3BC_C908;
/// See [`SALT_IID`].
pub const SALT_CYCLIC: u64 = 0xBB67_AE85_84CA_A73B;
/// Added to the step (IID) or cycle number (cyclic) before it is mixed, so step 0 is not the
/// fixed point of [`mix64`].
pub const SALT_COUNTER: u64 = 0x3C6E_F372_FE94_F82B;
/// Domain separation for the rejection redraw stream of an IID batch.
pub const SALT_REJECT: u64 = 0xA54F_F53A_5F1D_36F1;

/// The `SplitMix64` output function: a bijective 64-bit mixer with full avalanche.
#[inline(always)]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Keyed combination of a mode key and a counter (step or cycle number).
///
/// For a fixed `key` it is a bijection of `counter` (and for a fixed counter a bijection of
/// `key`), so two different steps of one sampler never share a batch key.
#[inline(always)]
pub const fn derive(key: u64, counter: u64) -> u64 {
    mix64(key ^ mix64(counter.wrapping_add(SALT_COUNTER)))
}

/// Element `i` of the `SplitMix64` stream that starts at state `state`.
#[inline(always)]
pub const fn stream(state: u64, i: u64) -> u64 {
    mix64(state.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // The first outputs of SplitMix64 seeded with 0, as published with the generator.
        assert_eq!(stream(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(stream(0, 1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(stream(0, 2), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn derive_separates_counters() {
        let a: Vec<u64> = (0..1000).map(|c| derive(7, c)).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(a.len(), b.len());
    }
}
