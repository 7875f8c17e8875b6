//! Dictionary training: zstd's fastCover trainer with the settings `ZDICT_trainFromBuffer` uses
//! (d = 8, four k candidates, level 3), but with its candidates tried on the compute pool's
//! number of threads. The candidates are independent dictionaries built and scored on the same
//! samples, so on two cores training takes about half as long; with one thread the result is
//! the dictionary `ZDICT_trainFromBuffer` gives.
//!
//! The safe zstd crates expose only the single-threaded entry point, so this module calls the C
//! trainer itself.
#![expect(
    unsafe_code,
    reason = "calls zstd's C dictionary trainer (no safe wrapper takes its parameters)"
)]

use std::io;

use zstd::zstd_safe::zstd_sys;

/// Trains a dictionary of at most `max_size` bytes on `samples`, the concatenation of samples
/// whose sizes are `sizes`, trying candidate parameters on `threads` threads.
pub fn train(
    samples: &[u8],
    sizes: &[usize],
    max_size: usize,
    threads: usize,
) -> io::Result<Vec<u8>> {
    if sizes.iter().sum::<usize>() != samples.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "sample sizes do not add up to the samples' bytes",
        ));
    }
    let count = u32::try_from(sizes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many samples"))?;
    let mut params = zstd_sys::ZDICT_fastCover_params_t {
        k: 0,
        d: 8,
        f: 0,
        steps: 4,
        nbThreads: u32::try_from(threads.clamp(1, 64)).unwrap_or(1),
        splitPoint: 0.0,
        accel: 0,
        shrinkDict: 0,
        shrinkDictMaxRegression: 0,
        zParams: zstd_sys::ZDICT_params_t { compressionLevel: 3, notificationLevel: 0, dictID: 0 },
    };
    let mut dict = vec![0u8; max_size];
    // SAFETY: `dict` is writable for `max_size` bytes; `samples` holds exactly the sum of `sizes`
    // bytes (checked above) and `sizes` has `count` entries; `params` is a valid, initialised
    // struct the trainer may write its chosen parameters into. Nothing is retained after the call.
    let written = unsafe {
        zstd_sys::ZDICT_optimizeTrainFromBuffer_fastCover(
            dict.as_mut_ptr().cast(),
            dict.len(),
            samples.as_ptr().cast(),
            sizes.as_ptr(),
            count,
            &raw mut params,
        )
    };
    // SAFETY: ZDICT_isError only inspects the integer it is given.
    if unsafe { zstd_sys::ZDICT_isError(written) } != 0 {
        // SAFETY: ZDICT_getErrorName returns a pointer to a static NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(zstd_sys::ZDICT_getErrorName(written)) };
        return Err(io::Error::other(name.to_string_lossy().into_owned()));
    }
    dict.truncate(written);
    Ok(dict)
}

#[cfg(test)]
mod tests {
    use super::train;

    /// Samples with shared structure (so a dictionary is worth training) and per-sample noise.
    fn samples() -> (Vec<u8>, Vec<usize>) {
        let mut state = 7u64;
        let mut buf = Vec::new();
        let mut sizes = Vec::new();
        for i in 0..400usize {
            let start = buf.len();
            buf.extend_from_slice(
                format!("{{\"id\": {i}, \"kind\": \"sample\", \"tags\": [").as_bytes(),
            );
            for _ in 0..20 {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                buf.extend_from_slice(format!("\"t{}\", ", (state >> 59)).as_bytes());
            }
            buf.extend_from_slice(b"\"end\"]}");
            sizes.push(buf.len() - start);
        }
        (buf, sizes)
    }

    #[test]
    fn one_thread_gives_zstds_default_dictionary() {
        let (buf, sizes) = samples();
        let ours = train(&buf, &sizes, 4096, 1).unwrap();
        let theirs = zstd::dict::from_continuous(&buf, &sizes, 4096).unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn threads_give_a_dictionary_as_good() {
        let (buf, sizes) = samples();
        let compressed = |dict: &[u8]| -> usize {
            let mut c = zstd::bulk::Compressor::with_dictionary(3, dict).unwrap();
            let mut at = 0;
            sizes
                .iter()
                .map(|&n| {
                    let frame = c.compress(&buf[at..at + n]).unwrap();
                    at += n;
                    frame.len()
                })
                .sum()
        };
        let one = train(&buf, &sizes, 4096, 1).unwrap();
        let four = train(&buf, &sizes, 4096, 4).unwrap();
        assert!(four.len() <= 4096);
        // The same candidates are scored; only the order they finish in (and so which of two
        // equally scored ones wins) can differ.
        assert!(compressed(&four) * 50 <= compressed(&one) * 51);
        assert!(compressed(&four) < buf.len() / 2);
    }

    #[test]
    fn mismatched_sizes_are_refused() {
        let (buf, mut sizes) = samples();
        sizes.push(1);
        assert!(train(&buf, &sizes, 4096, 2).is_err());
    }
}
