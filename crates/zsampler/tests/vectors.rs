//! Known answers: a subset of `tests/sampler_vectors.json` at the repository root (the cases
//! whose Python seed maps to the native seed by plain reduction mod 2^64), so a change to the
//! sequences fails `cargo test` as well as the Python suite. The sequences are a public contract:
//! a resumed training run depends on them.

use zsampler::{Mode, Sampler};

struct Case {
    name: &'static str,
    length: u64,
    batch_size: u64,
    mode: Mode,
    seed: u64,
    batches: &'static [(u64, &'static [u64])],
}

const CASES: &[Case] = &[
    Case {
        name: "sequential-huge-length",
        length: 9223372036854775807,
        batch_size: 3,
        mode: Mode::Sequential,
        seed: u64::MAX, // the seed -1 as the Python API passes it
        batches: &[
            (0, &[0, 1, 2]),
            (1, &[3, 4, 5]),
            (2, &[6, 7, 8]),
            (18446744073709551615, &[3, 4, 5]),
        ],
    },
    Case {
        name: "iid-1M",
        length: 1000000,
        batch_size: 8,
        mode: Mode::Iid,
        seed: 42,
        batches: &[
            (0, &[326577, 136414, 314522, 227474, 154366, 321043, 395976, 392402]),
            (1, &[851883, 630382, 740207, 549771, 769782, 64297, 514673, 608992]),
            (2, &[977512, 281889, 80711, 773391, 669960, 729257, 622793, 647678]),
        ],
    },
    Case {
        name: "iid-odd-start-tiny",
        length: 7,
        batch_size: 5,
        mode: Mode::Iid,
        seed: 0,
        batches: &[(0, &[6, 3, 6, 2, 0]), (1, &[2, 2, 3, 6, 0]), (2, &[6, 2, 0, 3, 4])],
    },
    Case {
        name: "iid-rejection-heavy",
        length: 2147483649,
        batch_size: 6,
        mode: Mode::Iid,
        seed: 7,
        batches: &[
            (0, &[912721588, 1819473944, 1888999194, 1828290412, 1635303027, 1757003049]),
            (1, &[1812917080, 1110439062, 1739414260, 375166169, 1446066933, 1456085018]),
            (2, &[950765874, 500156050, 1079986816, 1414337119, 838032874, 493265041]),
        ],
    },
    Case {
        name: "iid-wide-huge-length",
        length: 9223372036854775807,
        batch_size: 4,
        mode: Mode::Iid,
        seed: (-123456789i64).cast_unsigned(),
        batches: &[
            (
                0,
                &[
                    2282359546217394939,
                    815987944794091088,
                    6330058052460085694,
                    6218547326008453882,
                ],
            ),
            (
                1,
                &[
                    7941882714472481017,
                    4542488881709408202,
                    4169490056684235554,
                    638944122221623613,
                ],
            ),
            (
                2,
                &[
                    4102177002043515727,
                    1215697816347746526,
                    6182843986542462152,
                    1503416447567388215,
                ],
            ),
            (
                1000000000000000,
                &[
                    7757817423250375325,
                    9120174912062097828,
                    3318962989847400641,
                    3205321781862013402,
                ],
            ),
        ],
    },
    Case {
        name: "cyclic-1M",
        length: 1000000,
        batch_size: 8,
        mode: Mode::Cyclic,
        seed: 42,
        batches: &[
            (0, &[270278, 975905, 633763, 428225, 831250, 91465, 369156, 676172]),
            (1, &[457281, 990390, 320817, 279066, 126400, 81112, 340917, 947887]),
            (2, &[574479, 597810, 803463, 421145, 591142, 793350, 838762, 510805]),
            (1000000000, &[972063, 137872, 391439, 374167, 518909, 263697, 398621, 550616]),
        ],
    },
    Case {
        name: "cyclic-remainder-dropped",
        length: 7,
        batch_size: 3,
        mode: Mode::Cyclic,
        seed: 42,
        batches: &[(0, &[0, 2, 6]), (1, &[4, 5, 1]), (2, &[5, 3, 0]), (3, &[6, 2, 1])],
    },
    Case {
        name: "cyclic-negative-seed",
        length: 1000,
        batch_size: 10,
        mode: Mode::Cyclic,
        seed: u64::MAX, // the seed -1 as the Python API passes it
        batches: &[
            (0, &[374, 654, 107, 521, 28, 571, 23, 762, 126, 393]),
            (1, &[733, 367, 985, 318, 581, 672, 554, 79, 824, 625]),
            (2, &[59, 452, 837, 877, 614, 355, 666, 468, 211, 264]),
        ],
    },
    Case {
        name: "cyclic-2^32",
        length: 4294967296,
        batch_size: 4,
        mode: Mode::Cyclic,
        seed: 9,
        batches: &[
            (0, &[1094412985, 2201958192, 902827583, 3618333898]),
            (1, &[1620656201, 903979102, 992448441, 3737939843]),
            (2, &[1182054798, 2692313159, 3795852863, 2305921374]),
        ],
    },
    Case {
        name: "cyclic-just-above-2^32",
        length: 4294967297,
        batch_size: 4,
        mode: Mode::Cyclic,
        seed: 9,
        batches: &[
            (0, &[1256798188, 3509770164, 541091896, 3419069789]),
            (1, &[1973796513, 1139184771, 1726883656, 728211785]),
            (2, &[3055954374, 929264284, 1857190964, 4256500547]),
        ],
    },
    Case {
        name: "cyclic-tiny",
        length: 2,
        batch_size: 1,
        mode: Mode::Cyclic,
        seed: 5,
        batches: &[(0, &[0]), (1, &[1]), (2, &[1]), (3, &[0])],
    },
];

#[test]
fn known_answers() {
    for case in CASES {
        let mut s = Sampler::new(case.length, case.batch_size, case.mode, case.seed).unwrap();
        for &(step, want) in case.batches {
            assert_eq!(s.batch(step), want, "{} at step {step}", case.name);
            s.seek(step);
            let mut out = vec![0; case.batch_size as usize];
            s.next_into(&mut out).unwrap();
            assert_eq!(out, want, "{} via next_into at step {step}", case.name);
        }
    }
}
