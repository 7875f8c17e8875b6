//! A mixture's run of positions: how many draws each source gives to positions
//! `first..first + n` of the mixed order, and the records of those draws, in one call.
//!
//! The mixed order of `loaderx.mix` repeats one *table*: the sources of the `q` positions of a
//! period (earliest deadline first; built and checked against every window by the Python layer,
//! `python/loaderx/_views/mix_plan.py`). Source `s`'s count among the first `m` positions is
//! `(m / q) * a[s]` plus its count in the table's first `m mod q` positions, `a[s]` being its
//! count in the whole table. A run of positions is each source's consecutive draws between its
//! counts at the run's two ends, so a loader's batch needs two counts and one run of draws per
//! source ([`SourceOrder::draws_into`]); nothing per position. Counts every [`BLOCK`] positions
//! of the table are kept, so a count costs at most a block's scan.
//!
//! The Python layer keeps the same arithmetic (`Table.counts`) as the reference model, and holds
//! the two equal; this is its batch path.

use crate::draws::SourceOrder;
use crate::SamplerError;

/// The table's counts are kept every this many positions.
pub const BLOCK: usize = 64;

/// Up to this many sources, a count within a block is one vector pass per source.
const FEW: usize = 8;

/// One period of a mixed order and its sources' permutations.
#[derive(Clone, Debug)]
pub struct MixedRun {
    /// The table: the source of each position of a period.
    src: Vec<u16>,
    /// Each source's count in the whole table (its integer weight).
    weight: Vec<u64>,
    /// Each source's count before position `j * BLOCK`, row `j` (sources in a row).
    blocks: Vec<u64>,
    orders: Vec<SourceOrder>,
}

impl MixedRun {
    /// The run maker of the table `src` (each position's source, a period's worth) and the
    /// sources' permutations (`orders[s]` is source `s`'s).
    ///
    /// Fails when the table is empty or names a source that `orders` does not have (a source
    /// with no position in it, a weight of 0, is never drawn).
    pub fn new(src: Vec<u16>, orders: Vec<SourceOrder>) -> Result<Self, SamplerError> {
        let k = orders.len();
        let bad = |reason: String| Err(SamplerError::BadMixTable { reason });
        if src.is_empty() || k == 0 {
            return bad(format!("a table of {} positions over {k} sources", src.len()));
        }
        let mut weight = vec![0u64; k];
        let mut blocks = Vec::with_capacity((src.len() / BLOCK + 1) * k);
        for (t, &s) in src.iter().enumerate() {
            if t % BLOCK == 0 {
                blocks.extend_from_slice(&weight);
            }
            match weight.get_mut(usize::from(s)) {
                Some(count) => *count += 1,
                None => return bad(format!("position {t} names source {s} of {k}")),
            }
        }
        Ok(Self { src, weight, blocks, orders })
    }

    /// The number of sources.
    pub fn sources(&self) -> usize {
        self.orders.len()
    }

    /// Every source's count among the first `positions` positions, into `out` (one per source).
    ///
    /// # Panics
    /// If `out` does not hold one entry per source.
    pub fn counts(&self, positions: u64, out: &mut [u64]) {
        let sources = self.sources();
        assert_eq!(out.len(), sources, "one count per source");
        let period = self.src.len() as u64;
        let (full, offset) = (positions / period, (positions % period) as usize);
        let block = offset / BLOCK;
        let before = &self.blocks[block * sources..];
        for ((count, &weight), &in_block) in out.iter_mut().zip(&self.weight).zip(before) {
            // full * weight <= positions, and a count within one period keeps the sum there.
            *count = full * weight + in_block;
        }
        let tail = &self.src[block * BLOCK..offset];
        if sources <= FEW {
            // One compare-and-count pass per source, which the compiler turns into vector
            // compares: a few instructions a source instead of a dependent add per position.
            for (s, count) in (0u16..).zip(out.iter_mut()) {
                *count += tail.iter().filter(|&&x| x == s).count() as u64;
            }
        } else {
            for &s in tail {
                out[usize::from(s)] += 1;
            }
        }
    }

    /// The run of positions `first..first + records.len()`: each source's count before it into
    /// `starts`, its draws in the run into `takes`, and the records of those draws into
    /// `records`, grouped by source in source order (source 0's draws first, each source's in
    /// its draw order).
    ///
    /// Fails when the run passes the last position (`u64::MAX`) or the slices do not hold one
    /// entry per source.
    pub fn run(
        &self,
        first: u64,
        records: &mut [u64],
        starts: &mut [u64],
        takes: &mut [u64],
    ) -> Result<(), SamplerError> {
        let k = self.sources();
        if starts.len() != k || takes.len() != k {
            return Err(SamplerError::BufferLength {
                expected: k as u64,
                got: starts.len().min(takes.len()) as u64,
            });
        }
        let count = records.len() as u64;
        let Some(end) = first.checked_add(count) else {
            return Err(SamplerError::DrawsOutOfRange { first, count });
        };
        self.counts(first, starts);
        self.counts(end, takes);
        let mut lo = 0usize;
        for ((take, &start), order) in takes.iter_mut().zip(starts.iter()).zip(&self.orders) {
            *take -= start; // counts never fall: the table's prefix counts only grow
            let m = usize::try_from(*take).expect("a source's draws in a run fit the run");
            order.draws_into(start, &mut records[lo..lo + m])?;
            lo += m;
        }
        debug_assert_eq!(lo, records.len(), "the draws of a run are its positions");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orders(lengths: &[u64]) -> Vec<SourceOrder> {
        lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let a = n.isqrt() + 1;
                SourceOrder::new(n, a, n.div_ceil(a), 0x1234 + i as u64).unwrap()
            })
            .collect()
    }

    /// A table of `q` positions with every source in it, by a small generator.
    fn table(q: usize, k: u16, seed: u64) -> Vec<u16> {
        let mut x = seed;
        let mut src: Vec<u16> = (0..q)
            .map(|_| {
                x = crate::mix::mix64(x.wrapping_add(crate::mix::GOLDEN));
                (x % u64::from(k)) as u16
            })
            .collect();
        for s in 0..k {
            src[usize::from(s)] = s;
        }
        src
    }

    fn brute_counts(src: &[u16], k: usize, m: u64) -> Vec<u64> {
        let q = src.len() as u64;
        let mut out = vec![0u64; k];
        for (t, &s) in (0..m.min(q)).zip(src) {
            out[usize::from(s)] += (m - t).div_ceil(q); // positions t, t + q, ... below m
        }
        out
    }

    #[test]
    fn counts_are_the_tables_prefix_counts() {
        for (q, k, seed) in
            [(1, 1, 0), (7, 3, 1), (64, 2, 2), (65, 2, 3), (1000, 5, 4), (129, 9, 5)]
        {
            let src = table(q, k, seed);
            let run = MixedRun::new(src.clone(), orders(&vec![100; usize::from(k)])).unwrap();
            let mut got = vec![0u64; usize::from(k)];
            for m in (0..3 * q as u64 + 5).chain([1 << 40, (1 << 40) + 77, u64::MAX]) {
                run.counts(m, &mut got);
                if m < 1 << 20 {
                    assert_eq!(got, brute_counts(&src, usize::from(k), m), "q {q} m {m}");
                }
                assert_eq!(got.iter().sum::<u64>(), m, "q {q} m {m}");
            }
        }
    }

    #[test]
    fn a_run_is_each_sources_draws_between_its_counts() {
        let lengths = [5u64, 64, 65, 1000];
        let src = table(37, 4, 9);
        let run = MixedRun::new(src, orders(&lengths)).unwrap();
        let os = orders(&lengths);
        for (first, n) in [(0u64, 1usize), (0, 37), (3, 100), (999_983, 256), (1 << 50, 33)] {
            let mut records = vec![0u64; n];
            let (mut starts, mut takes) = (vec![0u64; 4], vec![0u64; 4]);
            run.run(first, &mut records, &mut starts, &mut takes).unwrap();
            let (mut c0, mut c1) = (vec![0u64; 4], vec![0u64; 4]);
            run.counts(first, &mut c0);
            run.counts(first + n as u64, &mut c1);
            assert_eq!(starts, c0);
            let mut lo = 0;
            for (s, order) in os.iter().enumerate() {
                assert_eq!(takes[s], c1[s] - c0[s]);
                let mut want = vec![0u64; takes[s] as usize];
                order.draws_into(c0[s], &mut want).unwrap();
                assert_eq!(&records[lo..lo + want.len()], &want[..]);
                assert!(want.iter().all(|&r| r < lengths[s]));
                lo += want.len();
            }
            assert_eq!(lo, n);
        }
    }

    #[test]
    fn bad_tables_and_runs_are_refused() {
        assert!(MixedRun::new(vec![], orders(&[3])).is_err());
        assert!(MixedRun::new(vec![0, 1], vec![]).is_err());
        assert!(MixedRun::new(vec![0, 2], orders(&[3, 3])).is_err()); // source 2 of 2
        let never = MixedRun::new(vec![0, 0], orders(&[3, 3])).unwrap(); // source 1: weight 0
        let (mut s, mut t) = (vec![0u64; 2], vec![0u64; 2]);
        never.run(5, &mut [0; 4], &mut s, &mut t).unwrap();
        assert_eq!((s, t), (vec![5, 0], vec![4, 0]));
        let run = MixedRun::new(vec![0, 1], orders(&[3, 3])).unwrap();
        let (mut s, mut t) = (vec![0u64; 2], vec![0u64; 2]);
        assert!(run.run(u64::MAX, &mut [0; 2], &mut s, &mut t).is_err());
        assert!(run.run(0, &mut [0; 2], &mut [0; 1], &mut t).is_err());
    }
}
