"""Tests of loaderx.sampler.Sampler: contract, statistics (fixed seeds) and known answers."""

from __future__ import annotations

import json
import math
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

from loaderx import _native
from loaderx.sampler import Mode, Sampler, normalize_seed

VECTORS = Path(__file__).with_name("sampler_vectors.json")
MODES = ("sequential", "iid", "cyclic")


def chi_square_limit(dof: int, z: float = 3.719) -> float:
    """Upper critical value of chi-square with ``dof`` degrees of freedom (Wilson-Hilferty);
    the default z is the one-sided 1e-4 quantile, so a fixed-seed test is not on a knife edge."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 of distinct values, by argsort."""
    r = np.empty(values.size, dtype=np.float64)
    r[np.argsort(values, kind="stable")] = np.arange(values.size, dtype=np.float64)
    return r


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a.astype(np.float64), b.astype(np.float64))[0, 1])


def cycle(sampler: Sampler, c: int) -> np.ndarray:
    """All the batches of cycle ``c`` of a cyclic sampler, concatenated."""
    per = sampler.batches_per_cycle
    return np.concatenate([sampler.batch(c * per + b) for b in range(per)])


# -- API ------------------------------------------------------------------------------------


def test_mode_names_and_numbers():
    assert Sampler.Mode is Mode
    assert [int(m) for m in Mode] == [0, 1, 2]
    for value, mode in [
        ("sequential", Mode.SEQUENTIAL),
        ("IID", Mode.IID),
        (" Cyclic ", Mode.CYCLIC),
        (0, Mode.SEQUENTIAL),
        (np.int64(1), Mode.IID),
        (Mode.CYCLIC, Mode.CYCLIC),
    ]:
        assert Sampler(10, 2, value).mode is mode
    assert Mode("cyclic") is Mode.CYCLIC


def test_next_returns_a_new_uint64_array_each_call():
    for mode in MODES:
        s = Sampler(100, 7, mode, seed=1)
        a, b = s.next(), s.next()
        assert a.dtype == np.uint64 and a.shape == (7,) and a.flags.c_contiguous
        assert a is not b and not np.shares_memory(a, b)
        kept = a.copy()
        s.next()
        np.testing.assert_array_equal(a, kept)
        assert s.step == 3


def test_iteration_is_endless_and_matches_next():
    s = Sampler(10, 3, "cyclic", seed=5)
    t = Sampler(10, 3, "cyclic", seed=5)
    assert iter(s) is s
    # strict=False: the sampler is endless; range(50) decides how many batches are compared.
    for _, batch in zip(range(50), s, strict=False):
        np.testing.assert_array_equal(batch, t.next())
    assert s.step == t.step == 50


def test_seek_and_batch_agree_with_iteration():
    for mode in MODES:
        s = Sampler(1009, 64, mode, seed=11)
        straight = [s.next() for _ in range(40)]
        fresh = Sampler(1009, 64, mode, seed=11)
        for k in (0, 39, 17, 3, 17):
            np.testing.assert_array_equal(fresh.batch(k), straight[k])
            fresh.seek(k)
            assert fresh.step == k
            np.testing.assert_array_equal(fresh.next(), straight[k])
            assert fresh.step == k + 1
        assert fresh.batch(5) is not fresh.batch(5)
        # batch() does not move the sampler.
        fresh.seek(20)
        fresh.batch(2)
        assert fresh.step == 20


def test_huge_steps_and_lengths():
    big = 2**64 - 1
    for mode in MODES:
        s = Sampler(2**63, 5, mode, seed=3)
        b = s.batch(big)
        assert b.dtype == np.uint64 and (b < 2**63).all()
        s.seek(big)
        np.testing.assert_array_equal(s.next(), b)
    s = Sampler(big, 4, "cyclic", seed=-7)
    assert len(set(s.batch(10**18).tolist())) == 4
    assert Sampler(big, 3, "sequential").batch(0).tolist() == [0, 1, 2]


def test_sequential_wraps():
    s = Sampler(5, 3, "sequential")
    assert [s.next().tolist() for _ in range(4)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]
    # batch larger than the space wraps within the batch
    assert Sampler(3, 7, "sequential").batch(1).tolist() == [1, 2, 0, 1, 2, 0, 1]
    n, bs = 1000, 96
    s = Sampler(n, bs, Mode.SEQUENTIAL)
    for k in (0, 10, 11, 12345):
        assert s.batch(k).tolist() == [(k * bs + j) % n for j in range(bs)]


def test_state_dict_round_trip_and_pickle():
    s = Sampler(1000, 10, "cyclic", seed=-3)
    for _ in range(7):
        s.next()
    state = s.state_dict()
    assert state == {"length": 1000, "batch_size": 10, "mode": "cyclic", "seed": -3, "step": 7}
    assert json.loads(json.dumps(state)) == state
    t = Sampler(1000, 10, "cyclic", seed=-3)
    t.load_state_dict(state)
    assert t.step == 7
    np.testing.assert_array_equal(t.next(), s.next())
    u = Sampler.from_state_dict(state)
    assert u.step == 7 and u.mode is Mode.CYCLIC and u.seed == -3
    v = pickle.loads(pickle.dumps(s))
    assert v.step == s.step
    np.testing.assert_array_equal(v.next(), s.next())
    # The same generator key from another spelling of the seed is the same sampler.
    Sampler(1000, 10, 2, seed=2**64 - 3).load_state_dict(state)


def test_load_state_dict_rejects_other_samplers():
    s = Sampler(1000, 10, "cyclic", seed=1)
    good = s.state_dict()
    for key, value in [("length", 999), ("batch_size", 5), ("mode", "iid"), ("seed", 2)]:
        with pytest.raises(ValueError, match=key):
            s.load_state_dict({**good, key: value})
    with pytest.raises(ValueError, match="missing"):
        s.load_state_dict({"length": 1000})
    with pytest.raises(ValueError):
        s.load_state_dict({**good, "step": -1})
    with pytest.raises(ValueError):
        s.load_state_dict([1, 2])


def test_value_errors():
    bad = [
        ((0, 1, "iid"), "length"),
        ((0, 1, "sequential"), "length"),
        ((0, 1, "cyclic"), "length"),
        ((10, 0, "iid"), "batch_size"),
        ((10, 0, "sequential"), "batch_size"),
        ((10, 0, "cyclic"), "batch_size"),
        ((10, 11, "cyclic"), "without replacement"),
        ((-1, 1, "iid"), "length"),
        ((2**64, 1, "iid"), "length"),
        ((10.0, 1, "iid"), "length"),
        (("10", 1, "iid"), "length"),
        ((True, 1, "iid"), "length"),
        ((10, 2.5, "iid"), "batch_size"),
        ((10, 2**64, "sequential"), "batch_size"),
        ((10, 1, "random"), "mode"),
        ((10, 1, 3), "mode"),
        ((10, 1, -1), "mode"),
        ((10, 1, 1.0), "mode"),
        ((10, 1, None), "mode"),
    ]
    for args, match in bad:
        with pytest.raises(ValueError, match=match):
            Sampler(*args)
    for seed in (1.5, "42", None, True, b"1"):
        with pytest.raises(ValueError, match="seed"):
            Sampler(10, 1, "iid", seed=seed)
    s = Sampler(10, 2, "iid")
    for step in (-1, 2**64, 1.0, "3"):
        with pytest.raises(ValueError, match="step"):
            s.seek(step)
        with pytest.raises(ValueError, match="step"):
            s.batch(step)
    # IID and sequential may draw more indices than there are.
    assert Sampler(10, 11, "iid").next().shape == (11,)
    assert Sampler(1, 1, "cyclic").next().tolist() == [0]


def test_native_checks_the_output_buffer():
    raw = _native.Sampler(100, 4, 1, 0)
    raw.fill(0, np.empty(4, np.uint64))
    cases = [
        np.empty(3, np.uint64),
        np.empty(5, np.uint64),
        np.empty(4, np.int32),
        np.empty(4, np.float64),
        np.empty(8, np.uint64)[::2],
        np.empty((2, 2), np.uint64, order="F").T[:, :1],
        "abcd",
    ]
    ro = np.empty(4, np.uint64)
    ro.flags.writeable = False
    cases.append(ro)
    for out in cases:
        with pytest.raises(ValueError):
            raw.fill(0, out)
        with pytest.raises(ValueError):
            raw.next_into(out)
    assert raw.step == 0, "a rejected buffer must not consume a step"
    with pytest.raises(ValueError, match="without replacement"):
        _native.Sampler(3, 4, 2, 0)
    with pytest.raises(ValueError, match="mode"):
        _native.Sampler(3, 1, 7, 0)
    # A 2-D C-contiguous buffer of the right size is fine.
    grid = np.zeros((2, 2), np.uint64)
    raw.fill(0, grid)
    np.testing.assert_array_equal(grid.ravel(), Sampler(100, 4, "iid", seed=0).batch(0))
    # Batches of 2**16 and more are computed detached from the interpreter: same values. An IID
    # entry depends on (seed, step, position) only, so a small batch is a prefix of a large one.
    big = Sampler(10**9, 1 << 17, "iid", seed=4).batch(5)
    np.testing.assert_array_equal(big[:1000], Sampler(10**9, 1000, "iid", seed=4).batch(5))
    whole = Sampler(1 << 17, 1 << 17, "cyclic", seed=4).batch(0)
    np.testing.assert_array_equal(np.sort(whole), np.arange(1 << 17))
    seq = Sampler(10**6, 1 << 17, "sequential").batch(9)
    np.testing.assert_array_equal(seq, (9 * (1 << 17) + np.arange(1 << 17)) % 10**6)


def test_threads_share_a_sampler_without_losing_or_repeating_steps():
    s = Sampler(2**40, 16, "sequential")
    got: list[list[np.ndarray]] = [[] for _ in range(4)]

    def work(slot: list[np.ndarray]) -> None:
        for _ in range(500):
            slot.append(s.next())

    threads = [threading.Thread(target=work, args=(g,)) for g in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    firsts = sorted(int(b[0]) // 16 for g in got for b in g)
    assert firsts == list(range(2000))
    assert s.step == 2000


# -- seeds ----------------------------------------------------------------------------------


def test_seed_mapping():
    assert normalize_seed(0) == 0
    assert normalize_seed(42) == 42
    assert normalize_seed(-1) == 2**64 - 1
    assert normalize_seed(-(2**63)) == 2**63
    assert normalize_seed(2**64 - 1) == 2**64 - 1
    assert normalize_seed(np.int64(-5)) == normalize_seed(np.uint64(2**64 - 5)) == 2**64 - 5
    huge = [2**64, 2**64 + 1, -(2**63) - 1, 10**40, -(10**40)]
    keys = [normalize_seed(s) for s in huge]
    assert all(0 <= k < 2**64 for k in keys)
    assert len(set(keys)) == len(keys)
    assert normalize_seed(2**64) != normalize_seed(0)
    assert normalize_seed(10**40) == normalize_seed(10**40)
    for mode in MODES[1:]:
        a = Sampler(10**6, 32, mode, seed=-1).batch(3)
        b = Sampler(10**6, 32, mode, seed=2**64 - 1).batch(3)
        np.testing.assert_array_equal(a, b)
        c = Sampler(10**6, 32, mode, seed=2**64).batch(3)
        d = Sampler(10**6, 32, mode, seed=0).batch(3)
        assert not np.array_equal(c, d)
    assert Sampler(10, 2, "iid", seed=10**30).seed == 10**30


def test_seeds_and_cycles_give_different_sequences():
    n = 5000
    a = Sampler(n, n, "cyclic", seed=1)
    b = Sampler(n, n, "cyclic", seed=2)
    perms = [a.batch(0), a.batch(1), a.batch(2), b.batch(0), b.batch(1)]
    for i in range(len(perms)):
        for j in range(i + 1, len(perms)):
            same = int((perms[i] == perms[j]).sum())
            assert same < 20, f"permutations {i} and {j} agree at {same} positions"
    x = Sampler(n, 256, "iid", seed=1)
    y = Sampler(n, 256, "iid", seed=2)
    assert not np.array_equal(x.batch(0), x.batch(1))
    assert not np.array_equal(x.batch(0), y.batch(0))


# -- statistics -----------------------------------------------------------------------------


def test_iid_is_uniform():
    buckets = 1000
    s = Sampler(buckets, 4096, "iid", seed=123)
    draws = np.concatenate([s.next() for _ in range(100)])
    assert draws.size == 100 * 4096
    # Every draw in range (bincount would otherwise grow extra buckets past `buckets`), every
    # bucket drawn (409.6 expected in each: an empty one means values the sampler never gives),
    # and the counts as even as uniform draws make them.
    assert int(draws.max()) < buckets
    counts = np.bincount(draws.astype(np.int64), minlength=buckets)
    assert counts.min() > 0, np.flatnonzero(counts == 0)[:10]
    assert chi_square(counts) < chi_square_limit(buckets - 1)


def test_iid_is_uniform_where_rejection_is_frequent():
    # 2**31 + 1: almost half of the 32-bit draws are rejected.
    n = 2**31 + 1
    s = Sampler(n, 8192, "iid", seed=9)
    draws = np.concatenate([s.next() for _ in range(40)])
    assert int(draws.max()) < n
    counts = np.bincount((draws >> np.uint64(22)).astype(np.int64), minlength=513)[:512]
    assert chi_square(counts) < chi_square_limit(511)
    # 3 * 2**61: the 64-bit path, rejecting one draw in eight.
    n = 3 * 2**61
    s = Sampler(n, 8192, "iid", seed=10)
    draws = np.concatenate([s.next() for _ in range(20)])
    assert int(draws.max()) < n
    counts = np.bincount((draws >> np.uint64(55)).astype(np.int64), minlength=192)
    # 853 draws expected in each of the 192 buckets (of 2**55 values each): none left empty.
    assert counts.min() > 0, np.flatnonzero(counts == 0)[:10]
    assert chi_square(counts) < chi_square_limit(191)


def test_iid_batches_are_independent():
    s = Sampler(10**6, 1024, "iid", seed=77)
    a = np.concatenate([s.batch(k) for k in range(0, 200, 2)])
    b = np.concatenate([s.batch(k) for k in range(1, 200, 2)])
    assert abs(pearson(a, b)) < 0.02
    within = np.concatenate([s.batch(k) for k in range(100)])
    assert abs(pearson(within[:-1], within[1:])) < 0.02


def test_cyclic_covers_every_record_once_per_cycle_when_batch_divides():
    n, bs = 1000, 100
    s = Sampler(n, bs, "cyclic", seed=42)
    assert s.batches_per_cycle == 10
    seen = []
    for _cycle in range(5):
        order = np.concatenate([s.next() for _ in range(10)])
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
        seen.append(order)
    assert all(not np.array_equal(seen[0], o) for o in seen[1:])


def test_cyclic_covers_at_most_once_otherwise_and_drops_a_different_remainder():
    n, bs = 1003, 100
    s = Sampler(n, bs, "cyclic", seed=42)
    assert s.batches_per_cycle == 10
    dropped = []
    reached = np.zeros(n, dtype=bool)
    for c in range(60):
        order = cycle(s, c)
        assert order.size == 1000 and np.unique(order).size == 1000
        assert int(order.max()) < n
        dropped.append(frozenset(set(range(n)) - set(order.tolist())))
        reached[order] = True
    assert all(len(d) == 3 for d in dropped)
    assert len(set(dropped)) > 50, "the dropped remainder should change from cycle to cycle"
    assert reached.all(), "every record is reached over the cycles"


def test_no_index_repeats_within_a_cyclic_batch():
    for n, bs, seed in [(10, 10, 0), (257, 256, 1), (1000, 999, 2), (2**40 + 3, 4096, 3)]:
        s = Sampler(n, bs, "cyclic", seed=seed)
        for _ in range(5):
            b = s.next()
            assert np.unique(b).size == bs
            assert int(b.max()) < n


def test_cyclic_adjacent_indices_are_uncorrelated():
    n, bs = 100_003, 1000
    s = Sampler(n, bs, "cyclic", seed=42)
    rs = []
    for _ in range(100):
        b = s.next().astype(np.float64)
        rs.append((b[:-1], b[1:]))
    left = np.concatenate([a for a, _ in rs])
    right = np.concatenate([b for _, b in rs])
    assert abs(pearson(left, right)) < 0.05
    # and within one batch taken alone
    one = Sampler(n, 50_000, "cyclic", seed=3).batch(0)
    assert abs(pearson(one[:-1], one[1:])) < 0.05


def test_cyclic_cycles_are_rank_uncorrelated():
    for n, bs in [(100_000, 1000), (65_537, 512), (1_000_000, 8192)]:
        s = Sampler(n, bs, "cyclic", seed=42)
        c0, c1 = cycle(s, 0), cycle(s, 1)
        rho = pearson(ranks(c0), ranks(c1))
        assert abs(rho) < 0.05, (n, rho)
        # nor with the position itself: a cycle is not a mild reordering of 0..n-1
        assert abs(pearson(ranks(c0), np.arange(c0.size))) < 0.05


def test_cyclic_position_distribution_is_uniform_over_cycles():
    n = 50
    s = Sampler(n, 10, "cyclic", seed=8)
    first = np.array([s.batch(c * 5)[0] for c in range(5000)])
    counts = np.bincount(first.astype(np.int64), minlength=n)
    assert chi_square(counts) < chi_square_limit(n - 1)


# -- known answers --------------------------------------------------------------------------


def load_vectors() -> list[dict]:
    return json.loads(VECTORS.read_text())["cases"]


def test_known_answer_vectors_cover_the_contract():
    cases = load_vectors()
    assert len(cases) >= 8
    assert {c["mode"] for c in cases} == set(MODES)
    assert any(c["length"] >= 2**63 - 1 for c in cases)
    assert any(c["seed"] < 0 for c in cases)


@pytest.mark.parametrize("case", load_vectors(), ids=lambda c: c["name"])
def test_known_answer_vectors(case):
    s = Sampler(case["length"], case["batch_size"], case["mode"], seed=case["seed"])
    for step, want in zip(case["steps"], case["batches"], strict=True):
        assert s.batch(step).tolist() == want, f"step {step}"
    if case["steps"][:3] == [0, 1, 2]:
        assert [s.next().tolist() for _ in range(3)] == case["batches"][:3]
