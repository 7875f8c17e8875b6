//! `zsampler`: the stateless batch index generator of loaderx.
//!
//! A [`Sampler`] draws batches of `batch_size` indices from the index space `[0, length)`. Every
//! batch is a pure function of `(length, batch_size, mode, seed, step)`: there is no epoch state,
//! so a run resumes exactly by seeking to a step, and [`Sampler::fill`] can compute any batch
//! directly, in any order, from any thread.
//!
//! # Modes
//!
//! * [`Mode::Sequential`]: batch `k` is `[(k * batch_size + j) mod length for j in 0..batch_size]`,
//!   a window sliding over the index space taken as a circular queue (the tail never truncates).
//! * [`Mode::Iid`]: uniform draws with replacement, exactly unbiased (Lemire's multiply-shift with
//!   rejection) from a counter-based generator keyed by `(seed, step)`. See the `iid` module source
//!   for the exact construction.
//! * [`Mode::Cyclic`]: without replacement. With `bpc = length / batch_size` batches per cycle,
//!   batch `k` belongs to cycle `c = k / bpc` and covers positions
//!   `q = (k mod bpc) * batch_size + j` of that cycle's permutation, a keyed Feistel network with
//!   cycle-walking ([`Permutation`]). Within a cycle every index appears at most once (exactly once
//!   when `batch_size` divides `length`); the `length mod batch_size` positions at the end of each
//!   cycle are dropped, and since every cycle has a fresh permutation they are different indices
//!   each cycle.
//!
//! # Seeds
//!
//! The seed is a plain `u64` and is used as given. The Python layer maps arbitrary Python
//! integers onto it (see `python/loaderx/sampler.py`).
//!
//! # Stability
//!
//! The sequences are a public contract (a resumed training run depends on them); the known-answer
//! vectors in `tests/sampler_vectors.json` at the repository root freeze them. Any change to the
//! constants or constructions here must keep those vectors passing.

// The one exception is the runtime CPU dispatch of `feistel`, which calls code compiled for
// instruction sets the CPU was checked to support.
#![deny(unsafe_code)]

pub mod draws;
mod feistel;
mod iid;
pub mod mix;
pub mod mixture;
pub mod packing;

pub use feistel::{domain_bits, Permutation, MIN_BITS, ROUNDS};

use std::fmt;

/// How a [`Sampler`] draws its indices. The discriminants are the stable wire values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Mode {
    /// In order, wrapping around the end of the index space.
    Sequential = 0,
    /// Uniformly at random, with replacement.
    Iid = 1,
    /// Without replacement: a fresh permutation of the index space per cycle.
    Cyclic = 2,
}

impl TryFrom<u8> for Mode {
    type Error = SamplerError;

    fn try_from(value: u8) -> Result<Self, Self::Error> {
        match value {
            0 => Ok(Mode::Sequential),
            1 => Ok(Mode::Iid),
            2 => Ok(Mode::Cyclic),
            other => Err(SamplerError::UnknownMode(other)),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Sequential => "sequential",
            Mode::Iid => "iid",
            Mode::Cyclic => "cyclic",
        })
    }
}

/// Why a sampler could not be built or a batch could not be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SamplerError {
    /// `length == 0`: there is nothing to draw from.
    ZeroLength,
    /// `batch_size == 0`.
    ZeroBatchSize,
    /// Cyclic mode with `batch_size > length`: a batch cannot be drawn without replacement.
    BatchLargerThanLength {
        /// The requested batch size.
        batch_size: u64,
        /// The index space length.
        length: u64,
    },
    /// A mode number other than 0, 1 or 2.
    UnknownMode(u8),
    /// The output buffer does not hold exactly the entries asked for.
    BufferLength {
        /// Entries the call writes.
        expected: u64,
        /// Entries the buffer holds.
        got: u64,
    },
    /// A partial fill reaching past the end of the batch.
    RangeOutOfBatch {
        /// First entry asked for.
        start: u64,
        /// Entries asked for.
        len: u64,
        /// The batch size.
        batch_size: u64,
    },
    /// A mixture source's permutation domain `[0, a * b)` does not hold its `length` records.
    BadDomain {
        /// The source's records.
        length: u64,
        /// The first digit's range.
        a: u64,
        /// The second digit's range.
        b: u64,
    },
    /// A run of draws reaching past the last draw number (`u64::MAX`).
    DrawsOutOfRange {
        /// The run's first draw.
        first: u64,
        /// Draws asked for.
        count: u64,
    },
    /// A mixture's table that is not one (see [`mixture::MixedRun::new`]).
    BadMixTable {
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for SamplerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SamplerError::ZeroLength => f.write_str("length must be at least 1, got 0"),
            SamplerError::ZeroBatchSize => f.write_str("batch_size must be at least 1, got 0"),
            SamplerError::BatchLargerThanLength { batch_size, length } => write!(
                f,
                "cyclic mode draws without replacement, so batch_size ({batch_size}) must not \
                 exceed length ({length})"
            ),
            SamplerError::UnknownMode(m) => {
                write!(f, "unknown mode {m}: expected 0 (sequential), 1 (iid) or 2 (cyclic)")
            }
            SamplerError::BufferLength { expected, got } => {
                write!(f, "output buffer holds {got} indices, expected batch_size = {expected}")
            }
            SamplerError::RangeOutOfBatch { start, len, batch_size } => write!(
                f,
                "entries {start}..{start}+{len} reach past the end of a batch of {batch_size}"
            ),
            SamplerError::BadDomain { length, a, b } => write!(
                f,
                "a permutation domain of {a} x {b} does not hold a source of {length} records"
            ),
            SamplerError::DrawsOutOfRange { first, count } => {
                write!(f, "{count} draws from draw {first} reach past the last draw number")
            }
            SamplerError::BadMixTable { reason } => write!(f, "not a mixture's table: {reason}"),
        }
    }
}

impl std::error::Error for SamplerError {}

/// A batch index generator over `[0, length)`. See the crate documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampler {
    length: u64,
    batch_size: u64,
    mode: Mode,
    seed: u64,
    step: u64,
    /// Per-mode key derived from the seed.
    key: u64,
}

impl Sampler {
    /// A sampler positioned at step 0.
    ///
    /// Fails when `length` or `batch_size` is 0, or in cyclic mode when `batch_size > length`.
    /// Any `length` up to `u64::MAX` works.
    pub fn new(length: u64, batch_size: u64, mode: Mode, seed: u64) -> Result<Self, SamplerError> {
        if length == 0 {
            return Err(SamplerError::ZeroLength);
        }
        if batch_size == 0 {
            return Err(SamplerError::ZeroBatchSize);
        }
        if mode == Mode::Cyclic && batch_size > length {
            return Err(SamplerError::BatchLargerThanLength { batch_size, length });
        }
        let key = match mode {
            Mode::Sequential => 0,
            Mode::Iid => iid::seed_key(seed),
            Mode::Cyclic => mix::mix64(seed ^ mix::SALT_CYCLIC),
        };
        Ok(Self { length, batch_size, mode, seed, step: 0, key })
    }

    /// Size of the index space.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Indices per batch.
    pub fn batch_size(&self) -> u64 {
        self.batch_size
    }

    /// The sampling mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The seed, as given.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The step of the batch [`Sampler::next_into`] writes next.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Position the sampler so the next batch is batch `step`.
    pub fn seek(&mut self, step: u64) {
        self.step = step;
    }

    /// Batches per cycle in cyclic mode (`length / batch_size`), `None` in the other modes.
    pub fn batches_per_cycle(&self) -> Option<u64> {
        (self.mode == Mode::Cyclic).then(|| self.length / self.batch_size)
    }

    /// Write batch `step` into `out`, which must hold exactly `batch_size` entries.
    /// Does not move the sampler.
    pub fn fill(&self, step: u64, out: &mut [u64]) -> Result<(), SamplerError> {
        let got = out.len() as u64;
        if got != self.batch_size {
            return Err(SamplerError::BufferLength { expected: self.batch_size, got });
        }
        self.fill_unchecked(step, 0, out);
        Ok(())
    }

    /// Write entries `start .. start + out.len()` of batch `step` into `out`: the same values
    /// [`Sampler::fill`] writes at those positions. Lets a caller produce a batch in pieces.
    pub fn fill_range(&self, step: u64, start: u64, out: &mut [u64]) -> Result<(), SamplerError> {
        let len = out.len() as u64;
        if start.checked_add(len).is_none_or(|end| end > self.batch_size) {
            return Err(SamplerError::RangeOutOfBatch { start, len, batch_size: self.batch_size });
        }
        self.fill_unchecked(step, start, out);
        Ok(())
    }

    /// Write batch `self.step()` into `out` and advance to the next step. `out` must hold exactly
    /// `batch_size` entries; on error the sampler does not move. The step wraps after `u64::MAX`.
    pub fn next_into(&mut self, out: &mut [u64]) -> Result<(), SamplerError> {
        self.fill(self.step, out)?;
        self.step = self.step.wrapping_add(1);
        Ok(())
    }

    /// Batch `step` as a new vector. Does not move the sampler.
    pub fn batch(&self, step: u64) -> Vec<u64> {
        let len = usize::try_from(self.batch_size).expect("batch_size exceeds the address space");
        let mut out = vec![0u64; len];
        self.fill_unchecked(step, 0, &mut out);
        out
    }

    /// The permutation cycle `cycle` walks, in cyclic mode; `None` in the other modes.
    pub fn cycle_permutation(&self, cycle: u64) -> Option<Permutation> {
        (self.mode == Mode::Cyclic)
            .then(|| Permutation::from_key(self.length, self.cycle_key(cycle)))
    }

    fn cycle_key(&self, cycle: u64) -> u64 {
        mix::derive(self.key, cycle)
    }

    /// `start + out.len() <= batch_size` is the caller's guarantee.
    fn fill_unchecked(&self, step: u64, start: u64, out: &mut [u64]) {
        let n = self.length;
        match self.mode {
            Mode::Sequential => {
                let first = u128::from(step) * u128::from(self.batch_size) + u128::from(start);
                // The remainder is below n, so it fits in u64.
                let mut idx = (first % u128::from(n)) as u64;
                for slot in out.iter_mut() {
                    *slot = idx;
                    idx += 1;
                    if idx == n {
                        idx = 0;
                    }
                }
            }
            Mode::Iid => iid::fill(self.key, step, n, start, out),
            Mode::Cyclic => {
                let per_cycle = n / self.batch_size;
                let cycle = step / per_cycle;
                // Below n: (per_cycle - 1) * batch_size + start + len <= per_cycle * batch_size.
                let q0 = (step % per_cycle) * self.batch_size + start;
                Permutation::from_key(n, self.cycle_key(cycle)).fill(q0, out);
            }
        }
    }
}
