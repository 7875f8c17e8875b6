//! Properties of the sampler: the Feistel map is a bijection, cycle-walking terminates and covers,
//! cyclic batches are distinct, the sequential formula holds, and every batch is a pure function
//! of (seed, step).

use proptest::prelude::*;
use std::collections::HashSet;
use zsampler::{domain_bits, Mode, Permutation, Sampler, SamplerError, MIN_BITS};

const PRIMES: [u64; 12] = [3, 5, 7, 11, 13, 31, 61, 127, 251, 509, 1021, 4093];

/// Enumerate the whole Feistel domain and check it is a permutation of itself, then check the
/// cycle-walked map is a permutation of [0, n).
fn check_bijection(n: u64, seed: u64, cycle: u64) {
    let p = Permutation::new(n, seed, cycle);
    let k = p.domain_bits();
    assert_eq!(k, domain_bits(n));
    assert!(n <= 1 << k, "domain must hold the index space");
    if n > 1 << (MIN_BITS - 1) {
        assert!(1u64 << k < 2 * n, "domain must be below 2n for n={n}");
    } else {
        assert_eq!(k, MIN_BITS);
    }
    let size = 1usize << k;
    let mut seen = vec![false; size];
    for x in 0..size as u64 {
        let y = p.feistel(x);
        assert!(y < size as u64, "feistel({x}) = {y} left the domain 2^{k}");
        assert!(!seen[y as usize], "feistel collision at {y} for n={n}");
        seen[y as usize] = true;
    }
    let mut hit = vec![false; n as usize];
    for q in 0..n {
        let y = p.index(q);
        assert!(y < n);
        assert!(!hit[y as usize], "walked collision at {y} for n={n}");
        hit[y as usize] = true;
    }
}

#[test]
fn bijection_small_lengths_exhaustive() {
    for n in 1..=300u64 {
        for seed in [0u64, 1, 42, u64::MAX] {
            check_bijection(n, seed, n % 5);
        }
    }
}

#[test]
fn bijection_primes_and_powers_of_two() {
    for &n in &PRIMES {
        check_bijection(n, 42, 0);
        check_bijection(n, 42, 1);
    }
    for k in 0..=16u32 {
        let n = 1u64 << k;
        check_bijection(n, 7, 0);
        if n > 1 {
            check_bijection(n - 1, 7, 0);
        }
        check_bijection(n + 1, 7, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any length up to 2^17, any seed, any cycle: exhaustive bijection check.
    #[test]
    fn bijection_random(n in 1u64..(1 << 17), seed in any::<u64>(), cycle in any::<u64>()) {
        check_bijection(n, seed, cycle);
    }

    /// Huge index spaces: the Feistel pass stays in the domain, is invertible on the sample
    /// (distinct inputs give distinct outputs), and cycle-walking terminates inside [0, n).
    #[test]
    fn huge_lengths_walk_terminates(n in (1u64 << 40)..=u64::MAX, seed in any::<u64>(),
                                    qs in proptest::collection::vec(any::<u64>(), 64)) {
        let p = Permutation::new(n, seed, 0);
        let k = p.domain_bits();
        let mut outs = HashSet::new();
        for &q in &qs {
            let q = q % n;
            let y = p.feistel(q);
            prop_assert!(k == 64 || y < 1 << k);
            let z = p.index(q);
            prop_assert!(z < n);
            outs.insert((q, z));
        }
        let distinct_q: HashSet<u64> = outs.iter().map(|&(q, _)| q).collect();
        let distinct_z: HashSet<u64> = outs.iter().map(|&(_, z)| z).collect();
        prop_assert_eq!(distinct_q.len(), distinct_z.len());
    }

    /// Cyclic batches hold distinct indices below n; the batches of one cycle are disjoint and,
    /// when batch_size divides n, cover [0, n).
    #[test]
    fn cyclic_cycle_is_disjoint(n in 1u64..5000, bs_frac in 0.0f64..1.0, seed in any::<u64>(),
                                cycle in 0u64..1000) {
        #[expect(clippy::cast_sign_loss, reason = "bs_frac is in [0, 1)")]
        let bs = ((n as f64 * bs_frac) as u64).clamp(1, n);
        let s = Sampler::new(n, bs, Mode::Cyclic, seed).unwrap();
        let per_cycle = s.batches_per_cycle().unwrap();
        prop_assert_eq!(per_cycle, n / bs);
        let mut seen = HashSet::new();
        for b in 0..per_cycle {
            let batch = s.batch(cycle * per_cycle + b);
            prop_assert_eq!(batch.len() as u64, bs);
            for &v in &batch {
                prop_assert!(v < n);
                prop_assert!(seen.insert(v), "index {} repeated within cycle {}", v, cycle);
            }
        }
        prop_assert_eq!(seen.len() as u64, per_cycle * bs);
    }

    /// Sequential batch k is [(k * bs + j) mod n].
    #[test]
    fn sequential_formula(n in 1u64..=u64::MAX, bs in 1u64..600, step in any::<u64>()) {
        let s = Sampler::new(n, bs, Mode::Sequential, 0).unwrap();
        let batch = s.batch(step);
        for (j, &v) in batch.iter().enumerate() {
            let want = (u128::from(step) * u128::from(bs) + j as u128) % u128::from(n);
            prop_assert_eq!(u128::from(v), want);
        }
    }

    /// fill(step) is what iterating from a fresh sampler gives at that step, whatever was drawn
    /// before, and fill_range pieces agree with the whole batch.
    #[test]
    fn purity(mode in 0u8..3, n in 1u64..100_000, bs in 1u64..700, seed in any::<u64>(),
              steps in 1u64..12, split in 0u64..700) {
        let mode = Mode::try_from(mode).unwrap();
        let bs = if mode == Mode::Cyclic { bs.min(n) } else { bs };
        let mut it = Sampler::new(n, bs, mode, seed).unwrap();
        let fixed = it.clone();
        let mut out = vec![0u64; bs as usize];
        for step in 0..steps {
            prop_assert_eq!(it.step(), step);
            it.next_into(&mut out).unwrap();
            prop_assert_eq!(&out, &fixed.batch(step));
            let mut direct = vec![0u64; bs as usize];
            fixed.fill(step, &mut direct).unwrap();
            prop_assert_eq!(&out, &direct);
            let split = (split % (bs + 1)) as usize;
            let mut pieces = vec![0u64; bs as usize];
            let (a, b) = pieces.split_at_mut(split);
            fixed.fill_range(step, 0, a).unwrap();
            fixed.fill_range(step, split as u64, b).unwrap();
            prop_assert_eq!(&out, &pieces);
            prop_assert!(out.iter().all(|&v| v < n));
        }
        // Seeking back reproduces the same batches.
        it.seek(steps / 2);
        it.next_into(&mut out).unwrap();
        prop_assert_eq!(&out, &fixed.batch(steps / 2));
    }

    /// IID over a huge space (the wide path) stays in range and is pure.
    #[test]
    fn iid_wide_in_range(n in ((1u64 << 32) + 1)..=u64::MAX, seed in any::<u64>(),
                         step in any::<u64>()) {
        let s = Sampler::new(n, 97, Mode::Iid, seed).unwrap();
        let a = s.batch(step);
        prop_assert!(a.iter().all(|&v| v < n));
        prop_assert_eq!(a, s.batch(step));
    }
}

#[test]
fn constructor_errors() {
    for mode in [Mode::Sequential, Mode::Iid, Mode::Cyclic] {
        assert_eq!(Sampler::new(0, 1, mode, 0), Err(SamplerError::ZeroLength));
        assert_eq!(Sampler::new(5, 0, mode, 0), Err(SamplerError::ZeroBatchSize));
    }
    assert_eq!(
        Sampler::new(5, 6, Mode::Cyclic, 0),
        Err(SamplerError::BatchLargerThanLength { batch_size: 6, length: 5 })
    );
    assert!(Sampler::new(5, 6, Mode::Sequential, 0).is_ok());
    assert!(Sampler::new(5, 6, Mode::Iid, 0).is_ok());
    assert!(Sampler::new(5, 5, Mode::Cyclic, 0).is_ok());
    assert_eq!(Mode::try_from(3), Err(SamplerError::UnknownMode(3)));
    let s = Sampler::new(10, 4, Mode::Iid, 0).unwrap();
    assert!(matches!(s.fill(0, &mut [0; 3]), Err(SamplerError::BufferLength { .. })));
    assert!(matches!(s.fill_range(0, 2, &mut [0; 3]), Err(SamplerError::RangeOutOfBatch { .. })));
    assert!(matches!(
        s.fill_range(0, u64::MAX, &mut [0; 2]),
        Err(SamplerError::RangeOutOfBatch { .. })
    ));
    assert!(!SamplerError::ZeroLength.to_string().is_empty());
}

#[test]
fn next_into_error_does_not_move() {
    let mut s = Sampler::new(10, 4, Mode::Cyclic, 3).unwrap();
    assert!(s.next_into(&mut [0; 5]).is_err());
    assert_eq!(s.step(), 0);
}

#[test]
fn sequential_wraps() {
    let s = Sampler::new(5, 3, Mode::Sequential, 0).unwrap();
    assert_eq!(s.batch(0), vec![0, 1, 2]);
    assert_eq!(s.batch(1), vec![3, 4, 0]);
    assert_eq!(s.batch(2), vec![1, 2, 3]);
    let s = Sampler::new(2, 5, Mode::Sequential, 0).unwrap();
    assert_eq!(s.batch(1), vec![1, 0, 1, 0, 1]);
    // n = 2^64 - 1 is odd: step (n - 1) / 2 starts at n - 1 and wraps to 0; the product
    // step * batch_size overflows u64 for larger steps and must not.
    let n = u64::MAX;
    let s = Sampler::new(n, 2, Mode::Sequential, 0).unwrap();
    assert_eq!(s.batch((n - 1) / 2), vec![n - 1, 0]);
    // 2 * (2^64 - 1) is a multiple of n: back at the start.
    assert_eq!(s.batch(u64::MAX), vec![0, 1]);
}

#[test]
fn cyclic_length_one_and_two() {
    let s = Sampler::new(1, 1, Mode::Cyclic, 9).unwrap();
    for step in 0..10 {
        assert_eq!(s.batch(step), vec![0]);
    }
    let s = Sampler::new(2, 2, Mode::Cyclic, 9).unwrap();
    let mut orders = HashSet::new();
    for step in 0..64 {
        let mut b = s.batch(step);
        orders.insert(b.clone());
        b.sort_unstable();
        assert_eq!(b, vec![0, 1]);
    }
    assert_eq!(orders.len(), 2, "both orders of a 2-cycle appear over 64 cycles");
    let s = Sampler::new(2, 1, Mode::Cyclic, 9).unwrap();
    for c in 0..32 {
        let mut pair = [s.batch(2 * c)[0], s.batch(2 * c + 1)[0]];
        pair.sort_unstable();
        assert_eq!(pair, [0, 1]);
    }
}

#[test]
fn cycles_and_seeds_differ() {
    let n = 1000u64;
    let a = Sampler::new(n, n, Mode::Cyclic, 1).unwrap();
    let b = Sampler::new(n, n, Mode::Cyclic, 2).unwrap();
    assert_ne!(a.batch(0), a.batch(1));
    assert_ne!(a.batch(0), b.batch(0));
    let ia = Sampler::new(n, 256, Mode::Iid, 1).unwrap();
    let ib = Sampler::new(n, 256, Mode::Iid, 2).unwrap();
    assert_ne!(ia.batch(0), ia.batch(1));
    assert_ne!(ia.batch(0), ib.batch(0));
}

#[test]
fn iid_narrow_boundary_lengths() {
    for n in [1u64, 2, 3, (1 << 31) + 1, (1 << 32) - 1, 1 << 32, (1 << 32) + 1] {
        let s = Sampler::new(n, 1001, Mode::Iid, 5).unwrap();
        let b = s.batch(3);
        assert!(b.iter().all(|&v| v < n), "n={n}");
        if n == 1 {
            assert!(b.iter().all(|&v| v == 0));
        }
    }
}

/// Lengths just above 2^31 make almost half the narrow draws rejections, which exercises the
/// redraw path; the result must still be uniform over halves of the space.
#[test]
fn iid_rejection_heavy_is_balanced() {
    let n = (1u64 << 31) + 1;
    let s = Sampler::new(n, 100_000, Mode::Iid, 17).unwrap();
    let b = s.batch(0);
    assert!(b.iter().all(|&v| v < n));
    let low = b.iter().filter(|&&v| v < n / 2).count() as f64;
    let frac = low / b.len() as f64;
    assert!((frac - 0.5).abs() < 0.01, "fraction below n/2 = {frac}");
}

#[test]
fn iid_mean_and_spread() {
    let n = 1_000_000u64;
    let s = Sampler::new(n, 200_000, Mode::Iid, 42).unwrap();
    let b = s.batch(7);
    let mean = b.iter().map(|&v| v as f64).sum::<f64>() / b.len() as f64;
    assert!((mean / n as f64 - 0.5).abs() < 0.005, "mean {mean}");
    let distinct: HashSet<u64> = b.iter().copied().collect();
    // Expected distinct draws: n * (1 - exp(-k/n)) ~ 181,269.
    assert!((distinct.len() as f64 - 181_269.0).abs() < 1_000.0, "{}", distinct.len());
}

/// Chi-square statistic of observed counts against a uniform expectation.
fn chi_square(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum()
}

/// Tiny index spaces are where a Feistel network is weakest: the six orders of a 3-record cycle
/// and the positions of a 5-record cycle must come out uniform over many cycles.
#[test]
fn tiny_cycles_are_uniform() {
    let cycles = 60_000u64;
    let s = Sampler::new(3, 3, Mode::Cyclic, 2024).unwrap();
    let mut orders = [0u64; 6];
    for c in 0..cycles {
        let b = s.batch(c);
        let order = match (b[0], b[1]) {
            (0, 1) => 0,
            (0, 2) => 1,
            (1, 0) => 2,
            (1, 2) => 3,
            (2, 0) => 4,
            (2, 1) => 5,
            _ => unreachable!("not a permutation: {b:?}"),
        };
        orders[order] += 1;
    }
    // 5 degrees of freedom: the 0.1% critical value is 20.5.
    assert!(chi_square(&orders) < 20.5, "orders {orders:?}");

    let s = Sampler::new(5, 5, Mode::Cyclic, 7).unwrap();
    let mut at = [[0u64; 5]; 5];
    for c in 0..cycles {
        for (q, &v) in s.batch(c).iter().enumerate() {
            at[q][v as usize] += 1;
        }
    }
    for row in &at {
        // 4 degrees of freedom: the 0.1% critical value is 18.5.
        assert!(chi_square(row) < 18.5, "positions {at:?}");
    }
}
