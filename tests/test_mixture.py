"""loaderx.mix: exact prefix proportions, per-pass permutations, schedules, the loader's side,
packed and ragged sources, and the pretraining pieces around them (issue 34)."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loaderx
from loaderx import (
    ConcatDataset,
    DataLoader,
    DenseDataset,
    RaggedDataset,
    _native,
    from_iterator,
    from_numpy,
    mix,
    pack,
)
from loaderx._views.mix_plan import (
    MIX_LENGTH,
    SMALL,
    MixPlan,
    Table,
    _second_share,
    build_pieces,
    draw_keys,
    permute,
    quantize,
    radix,
    small_orders,
)
from loaderx.errors import LoaderxIndexError, LoaderxTypeError, LoaderxValueError

PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])


# -- helpers ---------------------------------------------------------------------------------


def _sources(root, sizes, dtype=np.int64, shape=()):
    """Dense sources whose record r of source s holds s * 1_000_000 + r."""
    out = []
    for s, n in enumerate(sizes):
        path = os.path.join(root, f"src{s}-{n}-{np.dtype(dtype).str}")
        if not os.path.exists(path):
            values = (np.arange(n, dtype=np.int64) + s * 1_000_000).astype(dtype)
            if shape:
                values = np.repeat(values[:, None], math.prod(shape), axis=1).reshape(n, *shape)
            from_numpy(path, values)
        out.append(DenseDataset(path))
    return out


def _decode(values):
    v = np.asarray(values).astype(np.int64)
    return v // 1_000_000, v % 1_000_000


def _counts(src, k):
    """Prefix counts: row n is each source's count among the first n + 1 positions."""
    return np.cumsum(np.eye(k, dtype=np.int64)[src], axis=0)


def _quota_ok(counts, a, q, start=1):
    """Every prefix count is floor or ceil of a_i n / q (n from ``start``)."""
    n = np.arange(start, start + len(counts), dtype=np.int64)[:, None]
    a = np.asarray(a, dtype=np.int64)[None, :]
    return bool(((counts + 1) * q > a * n).all() and ((counts - 1) * q < a * n).all())


weights_st = st.lists(st.integers(0, 12), min_size=1, max_size=7).filter(any)


# -- the order -------------------------------------------------------------------------------


@PROPS
@given(weights_st)
def test_every_prefix_of_a_table_is_within_one_record(w):
    a, exact = quantize(w)
    assert exact and int(a.sum()) == sum(w) // math.gcd(*w) or int(a.sum()) <= sum(w)
    table = Table(a)
    q = table.q
    src = np.tile(table.src.astype(np.int64), 3)  # three periods: the order repeats exactly
    assert _quota_ok(_counts(src, len(w)), a, q)


@PROPS
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=6).filter(
    lambda w: sum(w) > 1e-3 and min(x for x in w if x > 0) / sum(w) > 1e-4))
def test_float_weights_are_kept_or_rounded_to_one_in_65536(w):
    a, exact = quantize(w)
    q = int(a.sum())
    assert q <= 1 << 16
    total = sum(w)
    for x, n in zip(w, a.tolist(), strict=True):
        assert abs(n / q - x / total) <= 1 / q
        if exact:
            assert Fraction(n, q) == Fraction(x) / Fraction(total) or abs(n / q - x / total) < 1e-9
    assert _quota_ok(_counts(Table(a).src.astype(np.int64), len(w)), a, q)


def test_nice_float_weights_keep_their_small_period():
    for w, q in (([0.7, 0.2, 0.1], 10), ([3, 1], 4), ([1, 1, 1], 3), ([0.5, 0.25, 0.25], 4),
                 ([2, 4], 3)):
        a, exact = quantize(w)
        assert exact and int(a.sum()) == q, (w, a)


def test_cumulative_rounding_would_make_a_count_fall():
    """Why the order is a table: rounding cumulative weights keeps each count within one, but
    with weights (0.5, 0.01, 0.49) source 1's count falls from 1 to 0 at n = 51."""
    cum = np.cumsum([0.5, 0.01, 0.49])
    rounded = [np.floor(cum * n + 0.5) for n in (50, 51)]
    counts = [np.diff(np.concatenate([[0], r])) for r in rounded]
    assert counts[0][1] == 1 and counts[1][1] == 0
    a, _ = quantize([0.5, 0.01, 0.49])
    table = Table(a)
    c = _counts(np.tile(table.src.astype(np.int64), 2), 3)
    assert (np.diff(c, axis=0) >= 0).all() and _quota_ok(c, a, table.q)


@PROPS
@given(weights_st, st.integers(0, 10**15), st.integers(1, 300))
def test_a_run_of_positions_is_the_order_at_those_positions(w, start, n):
    """The loader's path (counts at a run's two ends, each source's consecutive draws) and the
    per-position path agree, and both agree with the plan's counts."""
    m = mix(_dense(len(w)), w, seed=start % 7)
    core = m._core
    idx = np.arange(start, start + n, dtype=np.uint64)
    run = core.resolve(idx)
    src, records = core.locate(idx)
    order = np.argsort(src, kind="stable")
    assert np.array_equal(run.src, src[order]) and np.array_equal(run.records, records[order])
    shuffled = np.random.default_rng(n).permutation(n)
    core._local.key = b""
    scattered = core.resolve(idx[shuffled])
    o2 = np.argsort(src[shuffled], kind="stable")
    assert np.array_equal(scattered.records, records[shuffled][o2])
    assert np.array_equal(np.bincount(src, minlength=len(w)),
                          np.array(m.counts(start + n)) - np.array(m.counts(start)))


_LARGE: list[DenseDataset] = []


@PROPS
@given(st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(any),
       st.integers(0, 10**15), st.integers(1, 2000), st.booleans())
def test_the_native_run_is_the_reference_order(w, start, n, native):
    """A run's one native call (counts at its two ends, every source's draws; sources above
    and below the small-source size, weights of 0 included) and the Python path give the
    per-position order's records, source by source."""
    if not _LARGE:
        import tempfile

        _LARGE.extend(_sources(tempfile.mkdtemp(prefix="loaderx-mix-"), [65, 1000, 30]))
    core = mix(_LARGE, w, seed=start % 5)._core
    assert core._mixed_run is not None
    if not native:
        core._mixed_run = None
    idx = np.arange(start, start + n, dtype=np.uint64)
    run = core.resolve(idx)
    src, records = core.locate(idx)
    order = np.argsort(src, kind="stable")
    assert np.array_equal(run.src, src[order]) and np.array_equal(run.records, records[order])
    assert run.take == np.bincount(src, minlength=3).tolist()
    for s, _, lo, hi, rows in run.groups:  # each group one source's pass, in its rows
        assert (src[order][lo:hi] == s).all() and np.array_equal(rows, records[order][lo:hi])


def test_a_schedule_takes_the_python_path():
    assert mix(_dense(2), None, schedule=[(0, [1, 1]), (100, [1, 3])],
               batch_size=10)._core._mixed_run is None


def test_a_batch_is_known_by_its_positions_not_its_bytes():
    """Index arrays of another dtype whose bytes equal the last batch's are other positions."""
    core = mix(_dense(2), [1, 1], seed=3)._core
    wide = core.resolve(np.array([1], dtype=np.uint64))
    narrow = core.resolve(np.array([1, 0], dtype=np.int32))  # the same 8 bytes
    assert sum(wide.take) == 1 and sum(narrow.take) == 2
    assert np.array_equal(narrow.records, core.resolve(np.array([1, 0], np.uint64)).records)


@PROPS
@given(st.lists(st.floats(0.01, 1), min_size=2, max_size=5), st.integers(0, 10**15),
       st.booleans())
def test_counts_as_python_integers_are_the_plans(w, n, scheduled):
    """The loader's counts (Python arithmetic on a table that keeps every prefix) agree with
    the plan's array path, on long periods without prefixes and on schedules."""
    sched = [(0, w), (1000, w[::-1])] if scheduled else None
    m = mix(_dense(len(w)), None if scheduled else w, schedule=sched,
            batch_size=10 if scheduled else None)
    plan = m._core.plan
    for at in (n, n % 20_000, 0):
        assert plan.counts_list(at) == plan.counts(at).tolist()


_DENSE: dict[int, list[DenseDataset]] = {}


def _dense(k):
    """k small dense sources of different lengths (made once per session)."""
    if k not in _DENSE:
        import tempfile

        root = tempfile.mkdtemp(prefix="loaderx-mix-")
        _DENSE[k] = _sources(root, [5 + 7 * s for s in range(k)])
    return _DENSE[k]


def test_a_long_prefix_of_the_mixed_order_is_within_one_record(tmp_path):
    m = mix(_sources(tmp_path, [100, 37, 1000]), [0.6, 0.3, 0.1], seed=1)
    src, _ = _decode(m[0:20_000])
    assert _quota_ok(_counts(src, 3), [6, 3, 1], 10)
    assert m.weights == [0.6, 0.3, 0.1] and m.period == 10


def test_far_positions_are_computed_directly(tmp_path):
    m = mix(_sources(tmp_path, [100, 37]), [0.7, 0.3], seed=1)
    for start in (10**6, 10**12, MIX_LENGTH - 1000):
        c0 = m.counts(start)
        assert abs(Fraction(c0[0]) - Fraction(7, 10) * start) < 1 and sum(c0) == start
        src, _ = _decode(m[start:start + 500])
        counts = [list(c0)]
        for s in src.tolist():
            counts.append([c + (i == s) for i, c in enumerate(counts[-1])])
        for n, (c_a, c_b) in enumerate(counts, start):  # exact: Python integers
            assert abs(10 * c_a - 7 * n) < 10 and abs(10 * c_b - 3 * n) < 10


# -- per-source permutations -----------------------------------------------------------------


@PROPS
@given(st.integers(1, 3000), st.integers(0, 2**63 - 1))
def test_a_pass_permutation_is_a_permutation(n, key):
    k = np.arange(n, dtype=np.uint64)
    a, b = radix(np.array([n]))
    y = permute(k, np.uint64(n), a[0], b[0], np.full(n, key, dtype=np.uint64))
    assert np.array_equal(np.sort(y), k)


@PROPS
@given(st.lists(st.integers(1, 40), min_size=1, max_size=4), st.integers(0, 3))
def test_each_pass_over_a_source_reads_all_of_it_once(sizes, seed):
    """No record of a source repeats before all of it was used; each pass is reshuffled."""
    m = mix(_dense_sizes(tuple(sizes)), [1] * len(sizes), seed=seed)
    src, rec = _decode(m[0:len(sizes) * max(sizes) * 3])
    for s, n in enumerate(sizes):
        drawn = rec[src == s]
        passes = [drawn[i * n:(i + 1) * n] for i in range(len(drawn) // n)]
        assert len(passes) >= 3
        for p in passes:
            assert sorted(p.tolist()) == list(range(n))
        if math.factorial(min(n, 20)) > 100:
            assert any(not np.array_equal(passes[0], p) for p in passes[1:])


def _reference_draws(n, base, first, count):
    """Records of draws ``first, ...`` of a source of ``n`` under key ``base``, by the NumPy
    reference model of the orders (mix_plan's draw_keys, permute and small_orders)."""
    d = np.arange(first, first + count, dtype=np.uint64)
    passes, k = d // np.uint64(n), d % np.uint64(n)
    keys = draw_keys(np.array([base], dtype=np.uint64), np.zeros(count, np.int64),
                     passes.astype(np.int64))
    if n <= SMALL:
        return np.array([small_orders(keys[i:i + 1], n)[0, int(k[i])] for i in range(count)],
                        dtype=np.uint64)
    a, b = radix(np.array([n]))
    return permute(k, np.uint64(n), a[0], b[0], keys)


@PROPS
@given(st.sampled_from([1, 2, 3, 63, 64, 65, 1000, 4097, 999_983, 2**40 + 3]),
       st.integers(0, 2**64 - 1), st.integers(0, 2**50), st.integers(1, 300))
def test_native_draws_are_the_reference_orders(n, base, first, count):
    """The native run of draws (what a loader batch reads) gives exactly the reference model's
    records, on small and large sources and across passes."""
    a, b = radix(np.array([n]))
    out = np.empty(count, dtype=np.uint64)
    _native.mix_draws(out, first, n, int(a[0]), int(b[0]), base)
    assert np.array_equal(out, _reference_draws(n, base, first, count))


def test_the_mixed_order_is_a_published_contract(tmp_path):
    """Known answers: a resumed run depends on the order, so no change may move it (these are
    the orders the NumPy-only implementation gave, before the draws went native)."""
    m = mix(_sources(tmp_path, [50, 1000]), [0.7, 0.3], seed=7)
    src, rec = _decode(m[0:12])
    assert src.tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0]
    assert rec.tolist() == [45, 41, 546, 14, 38, 374, 49, 37, 539, 35, 39, 19]
    src, rec = _decode(m[10**9:10**9 + 6])
    assert src.tolist() == [0, 0, 1, 0, 0, 1] and rec.tolist() == [19, 28, 870, 11, 12, 477]
    out = np.empty(3, np.uint64)
    _native.mix_draws(out, 10**12, 2**40 + 3, *(int(x[0]) for x in radix(np.array([2**40 + 3]))),
                      0x0123456789ABCDEF)
    assert out.tolist() == [337917445440, 328368156916, 852410490329]


def test_native_draws_refuse_a_domain_that_misses_records():
    out = np.empty(4, dtype=np.uint64)
    with pytest.raises(LoaderxValueError, match="does not hold a source of 1000 records"):
        _native.mix_draws(out, 0, 1000, 10, 99, 0)
    with pytest.raises(LoaderxValueError, match="past the last draw"):
        _native.mix_draws(out, 2**64 - 2, 1000, 10, 100, 0)
    with pytest.raises(LoaderxValueError, match="length must be at least 1"):
        _native.mix_draws(out, 0, 0, 1, 1, 0)


_SIZED: dict[tuple[int, ...], list[DenseDataset]] = {}


def _dense_sizes(sizes):
    if sizes not in _SIZED:
        import tempfile

        _SIZED[sizes] = _sources(tempfile.mkdtemp(prefix="loaderx-mix-"), list(sizes))
    return _SIZED[sizes]


def test_stats_say_how_often_each_source_cycled(tmp_path):
    m = mix(_sources(tmp_path, [1000, 10]), [0.5, 0.5])
    stats = m.stats(2000)
    assert [s["drawn"] for s in stats] == [1000, 1000]
    assert [s["passes"] for s in stats] == [1.0, 100.0]


def test_the_seed_changes_the_permutations_not_the_proportions(tmp_path):
    srcs = _sources(tmp_path, [50, 30])
    a, b = mix(srcs, [1, 1], seed=0), mix(srcs, [1, 1], seed=1)
    sa, ra = _decode(a[0:200])
    sb, rb = _decode(b[0:200])
    assert np.array_equal(sa, sb) and not np.array_equal(ra, rb)


# -- the loader ------------------------------------------------------------------------------


def _run(streams, steps, **kw):
    with DataLoader(streams, **kw) as loader:
        return [next(loader) for _ in range(steps)]


def test_the_loader_reads_the_mixed_order_and_each_batch_holds_its_share(tmp_path):
    m = mix(_sources(tmp_path, [500, 300, 60]), [0.5, 0.3, 0.2], seed=3)
    batches = _run({"x": m}, 30, batch_size=40, num_workers=0)
    for k, b in enumerate(batches):
        src, rec = _decode(b["x"])
        assert np.array_equal(src, b["x_source"])
        share = np.bincount(src, minlength=3)
        assert (np.abs(share - 40 * np.array([0.5, 0.3, 0.2])) <= 2).all()
        # The batch is positions k*40 ... (k+1)*40 - 1, grouped by source.
        expect_src, expect_rec = m.locate(m.batch_order(np.arange(k * 40, (k + 1) * 40)))
        assert np.array_equal(src, expect_src) and np.array_equal(rec, expect_rec)
        assert (np.diff(src) >= 0).all()


def test_mode_iid_is_refused_and_sequential_reads_the_same(tmp_path):
    m = mix(_sources(tmp_path, [50, 20]), [1, 1])
    with pytest.raises(LoaderxValueError, match="mode='iid' does not apply"):
        DataLoader({"x": m}, batch_size=4, mode="iid")
    a = _run({"x": m}, 5, batch_size=4, num_workers=0)
    b = _run({"x": m}, 5, batch_size=4, num_workers=0, mode="sequential", seed=99)
    assert all(np.array_equal(x["x"], y["x"]) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_batches_do_not_depend_on_workers(tmp_path, workers):
    m = mix(_sources(tmp_path, [500, 300, 60]), [5, 3, 2], seed=3)
    ref = _run({"x": m}, 12, batch_size=16, num_workers=0)
    got = _run({"x": m}, 12, batch_size=16, num_workers=workers)
    assert all(np.array_equal(r["x"], g["x"]) for r, g in zip(ref, got, strict=True))


def test_process_workers_read_the_same_batches(tmp_path):
    streams = mix([{"x": a, "y": b} for a, b in zip(_sources(tmp_path, [40, 25]),
                                                      _sources(tmp_path / "y", [40, 25]),
                                                      strict=True)], [2, 1], seed=5)
    ref = _run(streams, 6, batch_size=6, num_workers=0)
    got = _run(streams, 6, batch_size=6, num_workers=2, worker_mode="process",
               start_method="fork")
    for r, g in zip(ref, got, strict=True):
        assert np.array_equal(r["x"], g["x"]) and np.array_equal(r["y"], g["y"])
        assert np.array_equal(r["x_source"], g["x_source"])


@PROPS
@given(st.integers(0, 10**9), st.sampled_from([1, 2, 4]), st.sampled_from([0, 2]))
def test_shards_hold_the_global_batch_on_any_hosts_and_workers(step, hosts, workers):
    m = mix(_dense(3), [3, 2, 1], seed=11)
    whole = _run({"x": m}, 1, batch_size=8, num_workers=0, start_step=step)[0]["x"]
    parts = [_run({"x": m}, 1, batch_size=8, num_workers=workers, start_step=step,
                  shard_index=i, shard_count=hosts)[0]["x"] for i in range(hosts)]
    assert sorted(np.concatenate(parts).tolist()) == sorted(whole.tolist())
    # Each host's slice is a run of positions: its share is exact within two rows too.
    for i, p in enumerate(parts):
        positions = np.arange(step * 8 + i * 8 // hosts, step * 8 + (i + 1) * 8 // hosts)
        _, rec = m.locate(m.batch_order(positions))
        src, _ = m.locate(m.batch_order(positions))
        assert np.array_equal(_decode(p)[1], rec) and np.array_equal(_decode(p)[0], src)


@PROPS
@given(st.integers(0, 10**6), st.integers(1, 30))
def test_resume_at_any_step(step, batch):
    m = mix(_dense(3), [0.6, 0.3, 0.1], seed=2)
    with DataLoader({"x": m}, batch_size=batch, num_workers=0, start_step=step) as a:
        first = next(a)["x"]
        state = a.state_dict()
        second = next(a)["x"]
    with DataLoader({"x": m}, batch_size=batch, num_workers=2) as b:
        b.load_state_dict(state)
        assert np.array_equal(next(b)["x"], second)
    with DataLoader({"x": m}, batch_size=batch, num_workers=0) as c:
        c.seek(step)
        assert np.array_equal(next(c)["x"], first)


def test_a_checkpoint_of_one_mixture_is_refused_on_another(tmp_path):
    srcs = _sources(tmp_path, [50, 20])
    with DataLoader({"x": mix(srcs, [1, 1])}, batch_size=4) as a:
        state = a.state_dict()
    for other in (mix(srcs, [2, 1]), mix(srcs, [1, 1], seed=1), mix(srcs[::-1], [1, 1])):
        with DataLoader({"x": other}, batch_size=4) as b, \
                pytest.raises(LoaderxValueError, match="other subsets"):
            b.load_state_dict(state)


def test_a_batch_size_change_names_the_recipe(tmp_path):
    m = mix(_sources(tmp_path, [50, 20]), [1, 1])
    with DataLoader({"x": m}, batch_size=4) as a:
        for _ in range(6):
            next(a)
        state = a.state_dict()
    with DataLoader({"x": m}, batch_size=8) as b, \
            pytest.raises(LoaderxValueError, match=r"start_step=rows_seen // new_batch_size"):
        b.load_state_dict(state)
    # The recipe continues the order exactly: 6 steps of 4 rows are 3 steps of 8.
    with DataLoader({"x": m}, batch_size=4, start_step=6) as small, \
            DataLoader({"x": m}, batch_size=8, start_step=6 * 4 // 8) as big:
        rows = np.concatenate([next(small)["x"], next(small)["x"]])
        assert sorted(next(big)["x"].tolist()) == sorted(rows.tolist())


def test_epoch_is_refused_with_the_reason(tmp_path):
    m = mix(_sources(tmp_path, [50, 20]), [1, 1])
    with DataLoader({"x": m}, batch_size=4) as loader, \
            pytest.raises(LoaderxValueError, match="a mixture has no end"):
        loader.epoch()


def test_a_mixture_and_a_plain_stream_are_refused_together(tmp_path):
    a, b = _sources(tmp_path, [50, 20])
    with pytest.raises(LoaderxValueError, match="mix aligned streams together"):
        DataLoader({"x": mix([a, b], [1, 1]), "y": a}, batch_size=4)


def test_aligned_streams_keep_their_pairs(tmp_path):
    xs = _sources(tmp_path / "x", [40, 12], dtype=np.float32, shape=(2,))
    ys = _sources(tmp_path / "y", [40, 12])
    streams = mix([{"image": xs[0], "label": ys[0]}, {"image": xs[1], "label": ys[1]}], [3, 1])
    assert set(streams) == {"image", "label"}
    for b in _run(streams, 10, batch_size=8, num_workers=2):
        assert sorted(b) == ["image", "image_source", "label"]
        assert np.array_equal(b["image"][:, 0].astype(np.int64), b["label"])
        assert (np.bincount(b["image_source"], minlength=2) == [6, 2]).all()


def test_ragged_sources_mix(tmp_path):
    def corpus(name, base, n):
        path = tmp_path / name
        from_iterator(path, [np.full(i % 4 + 1, base + i, np.int32) for i in range(n)])
        return RaggedDataset(path)

    m = mix([corpus("a", 0, 30), corpus("b", 1000, 7)], [3, 1], seed=1)
    assert m.kind == "ragged"
    records = m[0:40]
    src = np.array([int(r[0]) >= 1000 for r in records], dtype=np.int64)
    assert _quota_ok(_counts(src, 2), [3, 1], 4)
    for b in _run({"t": m}, 5, batch_size=8, num_workers=2):
        firsts = [int(r[0]) for r in b["t"]]
        assert [f >= 1000 for f in firsts] == b["t_source"].astype(bool).tolist()
        assert all(len(r) == (f % 1000) % 4 + 1 for r, f in zip(b["t"], firsts, strict=True))


def test_a_mixture_pickles_and_dict_streams_share_one_order_again(tmp_path):
    streams = mix([{"x": a, "y": a} for a in _sources(tmp_path, [30, 11])], [1, 2], seed=4)
    again = pickle.loads(pickle.dumps(streams))
    assert again["x"]._core is again["y"]._core
    assert np.array_equal(again["x"][0:50], streams["x"][0:50])


# -- schedules -------------------------------------------------------------------------------


def _schedule_counts(m, rows):
    src, _ = _decode(m[0:rows])
    return _counts(src, len(m.sources))


@pytest.mark.parametrize("transition", ["linear", "step"])
def test_a_schedule_is_exact_at_its_milestones_and_close_between(tmp_path, transition):
    srcs = _sources(tmp_path, [100, 50, 20])
    sched = [(0, [1, 0, 0]), (10, [0.5, 0.25, 0.25]), (30, [0.2, 0.2, 0.6])]
    m = mix(srcs, schedule=sched, transition=transition, batch_size=16)
    rows = 16 * 50
    counts = _schedule_counts(m, rows)
    target = np.array([m.target(n) for n in range(1, rows + 1)])
    dev = np.abs(counts - target)
    in_ramp = np.zeros(rows, bool)
    if transition == "linear":
        in_ramp[:16 * 30] = True
    assert (dev[~in_ramp] < 1).all() and (dev[in_ramp] < 2.5).all()
    for step in (10, 30):
        n = 16 * step
        assert np.array_equal(counts[n - 1], np.round(target[n - 1]))  # milestones: exact
    assert m.weights_at(0) == [1.0, 0.0, 0.0] and m.weights_at(40) == [0.2, 0.2, 0.6]
    if transition == "linear":
        assert m.weights_at(5) == pytest.approx([0.75, 0.125, 0.125])
    else:
        assert m.weights_at(5) == [1.0, 0.0, 0.0]


@PROPS
@given(st.integers(0, 60), st.sampled_from([0, 2]))
def test_resume_inside_a_transition(step, workers):
    m = mix(_dense(2), schedule=[(0, [1, 3]), (20, [3, 1]), (40, [1, 1])], batch_size=12,
            seed=8)
    ref = _ref_schedule_batches()
    with DataLoader({"x": m}, batch_size=12, num_workers=workers, start_step=step) as loader:
        assert np.array_equal(next(loader)["x"], ref[step])
        state = loader.state_dict()
    with DataLoader({"x": m}, batch_size=12, num_workers=0) as again:
        again.load_state_dict(state)
        assert np.array_equal(next(again)["x"], ref[step + 1])


_REF: list[np.ndarray] = []


def _ref_schedule_batches():
    if not _REF:
        m = mix(_dense(2), schedule=[(0, [1, 3]), (20, [3, 1]), (40, [1, 1])], batch_size=12,
                seed=8)
        _REF.extend(b["x"] for b in _run({"x": m}, 62, batch_size=12, num_workers=0))
    return _REF


def test_the_transition_split_is_exact_integer_arithmetic():
    for length in (2, 3, 1000, 10**9, 2**40):
        t = np.unique(np.linspace(0, length, 2000).astype(np.int64))
        got = _second_share(t, length)
        expect = [(int(x) ** 2 + length) // (2 * length) for x in t]
        assert got.tolist() == expect


def test_a_schedule_needs_its_batch_size_and_checks_the_loaders(tmp_path):
    srcs = _sources(tmp_path, [50, 20])
    with pytest.raises(LoaderxValueError, match="pass batch_size="):
        mix(srcs, schedule=[(0, [1, 0]), (10, [0, 1])])
    m = mix(srcs, schedule=[(0, [1, 0]), (10, [0, 1])], batch_size=8)
    with pytest.raises(LoaderxValueError, match="counts steps of 8 rows"):
        DataLoader({"x": m}, batch_size=16)


# -- packed sources --------------------------------------------------------------------------


def _corpus(path, lo, hi, n, seed):
    rng = np.random.default_rng(seed)
    from_iterator(path, [rng.integers(lo, hi, int(k), dtype=np.uint16)
                         for k in rng.integers(3, 90, n)], codec="raw")
    return RaggedDataset(path)


def test_packed_sources_carry_their_segment_ids_and_positions(tmp_path):
    code = pack(_corpus(tmp_path / "code", 1, 100, 60, 0), 32, eos_id=0)
    prose = pack(_corpus(tmp_path / "prose", 100, 200, 40, 1), 32, eos_id=0)
    m = mix([code, prose], [3, 1], seed=2)
    for k, b in enumerate(_run({"tok": m}, 8, batch_size=8, num_workers=2)):
        assert sorted(b) == ["tok", "tok_positions", "tok_segment_ids", "tok_source"]
        src, rec = m.locate(m.batch_order(np.arange(k * 8, (k + 1) * 8)))
        for i in range(8):
            view = (code, prose)[int(src[i])]
            seg, pos = view.segments([int(rec[i])])
            assert np.array_equal(b["tok"][i], view[int(rec[i])])
            assert np.array_equal(b["tok_segment_ids"][i], seg[0])
            assert np.array_equal(b["tok_positions"][i], pos[0])


def test_packed_sources_without_their_native_batch_call_read_the_same(tmp_path, monkeypatch):
    """The way a packed source is read when it has no bound native call (each source's
    gather_with_segments into its rows of the batch) gives the batch the native calls give."""
    code = pack(_corpus(tmp_path / "code", 1, 100, 60, 0), 32, eos_id=0)
    prose = pack(_corpus(tmp_path / "prose", 100, 200, 40, 1), 32, eos_id=0)
    m = mix([code, prose], [3, 1], seed=2)

    def batch(start):
        idxs = np.arange(start, start + 16, dtype=np.uint64)
        dst = np.empty(16 * m.record_bytes, dtype=np.uint8)
        m.gather_rows(idxs, dst)
        return dst, m.companions("tok", idxs)

    native = [batch(k * 16) for k in range(6)]
    monkeypatch.setattr(m, "_one_call", None)
    monkeypatch.setattr(m, "_fills", [None] * 2)
    monkeypatch.setattr(m._core, "filler", lambda *a: None)
    for k, (dst, comp) in enumerate(native):
        got, got_comp = batch(k * 16)
        assert np.array_equal(got, dst)
        assert sorted(got_comp) == sorted(comp)
        for key in comp:
            assert np.array_equal(got_comp[key], comp[key]), key
    assert native[0][1]["tok_segment_ids"].any() and native[0][1]["tok_positions"].any()


def _count_native_batches(m):
    """A list that gets, for each native batch call of ``m`` from now on, whether it read the
    batch (positions that are not a run are left to the Python path)."""
    real = m._one_call
    assert real is not None
    calls = []

    class Counting:
        def fill(self, *a):
            got = real.fill(*a)
            calls.append(got is not None)
            return got

    m._one_call = Counting()
    return calls


def _packed_sources(tmp_path):
    """Packed views of every layout a mixture reads in one native call -- concat over a raw
    store, first_fit over a zstd store, a view of a subset, documents stored in pieces, and a
    source of a few rows (it cycles inside a batch) -- each with a twin that reads through
    Python (no native store): the reference."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(1, 60000, int(k), dtype=np.uint16) for k in rng.integers(3, 90, 70)]
    from_iterator(tmp_path / "raw", docs, codec="raw")
    from_iterator(tmp_path / "zstd", docs[:40], codec="zstd")
    from_iterator(tmp_path / "pieces", docs[30:], codec="raw", max_record_bytes=64)
    from_iterator(tmp_path / "few", docs[:3], codec="raw")
    makers = [
        lambda: pack(RaggedDataset(tmp_path / "raw"), 32, eos_id=0),
        lambda: pack(RaggedDataset(tmp_path / "zstd"), 32, method="first_fit", eos_id=0,
                     pad_id=7, truncate=True),
        lambda: pack(RaggedDataset(tmp_path / "raw").subset(np.arange(69, 5, -3)), 32),
        lambda: pack(RaggedDataset(tmp_path / "pieces"), 32, eos_id=1),
        lambda: pack(RaggedDataset(tmp_path / "few"), 32, eos_id=0),
    ]
    views = [make() for make in makers]
    refs = [make() for make in makers]
    for ref in refs:
        ref._native = None
    assert len(views[4]) <= 8
    return views, refs


@pytest.mark.parametrize("emit", [True, False])
def test_a_mixture_of_packed_views_reads_a_batch_in_one_native_call(tmp_path, emit):
    """The batch of a run of positions (what the loader asks for) is read in one native call
    (_native.MixedBatch): its rows, segment ids, positions and sources equal each source's row
    read through Python, for every layout, through passes over a small source; positions that
    are not a run take the per-source path and read the same."""
    views, refs = _packed_sources(tmp_path)
    m = mix(views, [3, 3, 2, 2, 4], seed=4)
    m._emit_source = emit  # (the second stream of a dict of sources has no _source key)
    calls = _count_native_batches(m)
    n = 48
    batches = [np.arange(k * n, (k + 1) * n, dtype=np.uint64) for k in range(5)]
    batches += [np.arange(1000, 1000 + n, dtype=np.uint64)[::-1].copy(),
                np.array([3, 3, 90, 1], dtype=np.uint64)]
    for idxs in batches:
        dst = np.empty(len(idxs) * m.record_bytes, dtype=np.uint8)
        m.gather_rows(idxs, dst)
        comp = m.companions("tok", idxs)
        rows = dst.view(np.uint16).reshape(len(idxs), 32)
        src, rec = m.locate(m.batch_order(idxs))
        assert sorted(comp) == sorted(["tok_segment_ids", "tok_positions"]
                                      + (["tok_source"] if emit else []))
        if emit:
            assert np.array_equal(comp["tok_source"], src)
        for i in range(len(idxs)):
            ref = refs[int(src[i])]
            seg, pos = ref.segments([int(rec[i])])
            assert np.array_equal(rows[i], ref[int(rec[i])]), (int(idxs[0]), i)
            assert np.array_equal(comp["tok_segment_ids"][i], seg[0])
            assert np.array_equal(comp["tok_positions"][i], pos[0])
    assert calls == [True] * 5 + [False, False]


def test_a_mixture_of_dense_datasets_reads_a_batch_in_one_native_call(tmp_path):
    """Dense sources (raw and zstd stores, 2 KiB records: a batch of 256 is split over the
    pool, its blocks cutting through stores) read a run of positions in one native call
    (_native.MixedBatch): every row is its source's record, the sources are the rows'; other
    positions take the per-source path and read the same."""
    rows = np.arange(300, dtype=np.int64)
    paths = []
    for s, (n, codec) in enumerate([(300, "raw"), (170, "zstd"), (9, "raw")]):
        values = np.repeat((rows[:n] + s * 1_000_000)[:, None], 256, axis=1)
        from_numpy(tmp_path / f"s{s}", values, codec=codec)
        paths.append(tmp_path / f"s{s}")
    m = mix([DenseDataset(p) for p in paths], [5, 3, 1], seed=6)
    calls = _count_native_batches(m)
    for idxs in [np.arange(k * 256, (k + 1) * 256, dtype=np.uint64) for k in range(4)] + [
            np.array([7, 2, 2, 900], dtype=np.uint64)]:
        dst = np.empty(len(idxs) * m.record_bytes, dtype=np.uint8)
        m.gather_rows(idxs, dst)
        got = dst.view(np.int64).reshape(len(idxs), 256)
        src, rec = m.locate(m.batch_order(idxs))
        assert (got == (src * 1_000_000 + rec.astype(np.int64))[:, None]).all()
        assert np.array_equal(m.companions("x", idxs)["x_source"], src)
    assert calls == [True] * 4 + [False]


def test_a_mixture_of_packed_views_in_a_loader_equals_the_per_source_path(tmp_path):
    """The loader's batches with the one native call and without it (each source read on its
    own) are the same, on threads and with shards."""
    views, _ = _packed_sources(tmp_path)
    kw = dict(batch_size=24, num_workers=2, shard_index=1, shard_count=2)
    m = mix(views, [1, 1, 1, 1, 1], seed=9)
    native = _run({"tok": m}, 6, **kw)
    slow = mix(views, [1, 1, 1, 1, 1], seed=9)
    slow._one_call = None
    for a, b in zip(native, _run({"tok": slow}, 6, **kw), strict=True):
        assert sorted(a) == sorted(b)
        for key in a:
            assert np.array_equal(a[key], b[key]), key


def test_companions_are_kept_for_the_positions_gathered_not_their_bytes(tmp_path):
    """The segment ids written by gather_rows are reused only for the same positions: an int32
    batch with the gathered uint64 batch's bytes gets its own."""
    code = pack(_corpus(tmp_path / "code", 1, 100, 60, 0), 32, eos_id=0)
    prose = pack(_corpus(tmp_path / "prose", 100, 200, 40, 1), 32, eos_id=0)
    m = mix([code, prose], [1, 1], seed=2)
    dst = np.empty(m.record_bytes, dtype=np.uint8)
    m.gather_rows(np.array([1], dtype=np.uint64), dst)
    narrow = np.array([1, 0], dtype=np.int32)  # the same 8 bytes
    got = m.companions("tok", narrow)
    assert got["tok_segment_ids"].shape == (2, 32)
    order = m.batch_order(narrow)
    src, rec = m.locate(order)
    for i in range(2):
        seg, _ = (code, prose)[int(src[i])].segments([int(rec[i])])
        assert np.array_equal(got["tok_segment_ids"][i], seg[0])


def test_packed_sources_of_another_seq_len_are_refused(tmp_path):
    docs = _corpus(tmp_path / "d", 1, 100, 30, 0)
    with pytest.raises(LoaderxValueError, match="source 1 .* packs rows of 16 tokens"):
        mix([pack(docs, 32), pack(docs, 16)], [1, 1])


def test_re_packing_per_pass_moves_the_rows_and_keeps_every_token(tmp_path):
    docs = _corpus(tmp_path / "d", 1, 60000, 80, 3)
    rows = pack(docs, 16, eos_id=0, repack=True)
    assert rows.repacks and rows.pass_view(0) is rows
    stream = np.concatenate([docs[i].astype(np.int64).tolist() + [0] for i in range(len(docs))])
    kept = len(rows) * 16
    passes = [rows.pass_view(p) for p in range(3)]
    assert len({len(p) for p in passes}) == 1
    for view in passes:
        tokens = np.sort(view[:].reshape(-1).astype(np.int64))
        # Every token once per pass, but the tail shorter than a row (a different one).
        assert len(tokens) == kept and len(stream) - kept < 16
        assert np.isin(tokens[tokens > 0], stream).all()
    assert not np.array_equal(passes[0][:], passes[1][:])
    # Through a mixture of one source: pass after pass, each packed and shuffled anew.
    m = mix([rows])
    seen = m[0:3 * len(rows)]
    for p in range(3):
        got = np.sort(seen[p * len(rows):(p + 1) * len(rows)].reshape(-1))
        assert np.array_equal(got, np.sort(passes[p][:].reshape(-1)))
    batches = _run({"t": m}, 3, batch_size=4, num_workers=2)
    assert np.array_equal(np.concatenate([b["t"] for b in batches]), seen[:12])
    with pytest.raises(LoaderxValueError, match=r"loaderx.mix\(\[rows\]\)"):
        DataLoader({"t": rows}, batch_size=4)


def test_first_fit_says_what_it_cut(tmp_path):
    docs = _corpus(tmp_path / "d", 1, 100, 40, 0)
    with pytest.warns(loaderx.errors.TruncationWarning, match=r"the rows keep \d+\.\d% of"):
        view = pack(docs, 16, method="first_fit")
    assert view.truncated > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pack(docs, 16, method="first_fit", truncate=True)  # asked for: no warning
        pack(docs, 100, method="first_fit")                # nothing cut
        pack(docs, 16)                                     # concat cuts nothing
    with pytest.raises(LoaderxValueError, match="pass truncate=True"):
        pack(docs, 16, method="first_fit", truncate=False)


# -- ConcatDataset of subsets, the command line ----------------------------------------------


def test_a_concatenation_takes_subsets_as_parts(tmp_path):
    a = _corpus(tmp_path / "a", 1, 100, 10, 0)
    b = _corpus(tmp_path / "b", 100, 200, 12, 1)
    both = ConcatDataset([a, b.subset([5, 2, 7])])
    assert len(both) == 13
    assert [r.tolist() for r in both[:]] == [r.tolist() for r in a[:]] + \
        [b[i].tolist() for i in (5, 2, 7)]
    rows = pack(both, 8)
    assert len(rows) == sum(len(r) for r in both[:]) // 8
    nested = ConcatDataset([ConcatDataset([a, b]).subset([0, 11]), b.subset([1])])
    assert [r.tolist() for r in nested[:]] == [a[0].tolist(), b[1].tolist(), b[1].tolist()]


def test_the_archive_command_and_its_old_name(tmp_path):
    from_numpy(tmp_path / "s", np.arange(10))
    cli = [sys.executable, "-m", "loaderx"]
    new = subprocess.run([*cli, "archive", str(tmp_path / "s"), str(tmp_path / "a.tar")],
                         capture_output=True, text=True)
    old = subprocess.run([*cli, "pack", str(tmp_path / "s"), str(tmp_path / "b.tar")],
                         capture_output=True, text=True)
    assert new.returncode == 0 and old.returncode == 0, (new.stderr, old.stderr)
    assert "old name of 'loaderx archive'" in old.stderr and not new.stderr
    help_text = subprocess.run([*cli, "--help"], capture_output=True, text=True).stdout
    assert "the old name of 'archive'" in help_text


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("weights, error, match", [
    ([1, -1], LoaderxValueError, "weight of source 1 is -1"),
    ([0, 0], LoaderxValueError, "every weight is 0"),
    ([1, float("nan")], LoaderxValueError, "weight of source 1 is nan"),
    ([1, float("inf")], LoaderxValueError, "weight of source 1 is inf"),
    ([1], LoaderxValueError, "1 weight for 2 sources"),
    ([1, 2, 3], LoaderxValueError, "3 weights for 2 sources"),
    ([1, "2"], LoaderxTypeError, "weight of source 1 is '2'"),
    ([True, 1], LoaderxTypeError, "weight of source 0 is True"),
    ("12", LoaderxTypeError, "must be a list of 2 numbers"),
    ([1, 1e-9], LoaderxValueError, "source 1's weight is 1e-09 of the total"),
])
def test_bad_weights(tmp_path, weights, error, match):
    with pytest.raises(error, match=match):
        mix(_sources(tmp_path, [10, 10]), weights)


def test_bad_sources(tmp_path):
    a, b = _sources(tmp_path, [10, 10])
    f = _sources(tmp_path / "f", [10], dtype=np.float32)[0]
    s = _sources(tmp_path / "s", [10], shape=(2,))[0]
    from_numpy(tmp_path / "empty", np.zeros(0, np.int64))
    r = _corpus(tmp_path / "r", 1, 9, 5, 0)
    cases = [
        ([a, f], LoaderxValueError, r"source 1 \(.*\) holds float32\(\) records"),
        ([a, s], LoaderxValueError, r"source 1 \(.*\) holds int64\(2,\) records"),
        ([a, r], LoaderxTypeError, r"source 1 \(.*\) is ragged"),
        ([a, DenseDataset(tmp_path / "empty")], LoaderxValueError, r"source 1 \(.*\) is empty"),
        ([a, str(tmp_path / "src0-10-<i8")], LoaderxTypeError, "source 1 .* is a path"),
        ([a, [1, 2]], LoaderxTypeError, "source 1 .* is a list"),
        ([a, mix([a, b], [1, 1])], LoaderxTypeError, "source 1 .* is itself a mixture"),
        ([a, {"x": b}], LoaderxTypeError, "source 1 is a dict, source 0 a stream"),
        ([], LoaderxTypeError, "non-empty list of sources"),
    ]
    for sources, error, match in cases:
        with pytest.raises(error, match=match):
            mix(sources, [1] * max(1, len(sources)))
    with pytest.raises(LoaderxValueError, match="source 1 has the streams"):
        mix([{"x": a}, {"y": b}], [1, 1])
    with pytest.raises(LoaderxValueError, match="needs weights"):
        mix([a, b])
    with pytest.raises(LoaderxValueError, match="not both"):
        mix([a, b], [1, 1], schedule=[(0, [1, 1])], batch_size=4)


@pytest.mark.parametrize("schedule, match", [
    ([(5, [1, 1])], "the first milestone starts at step 0"),
    ([(0, [1, 1]), (0, [1, 2])], "not after schedule"),
    ([(0, [1, 1]), (10, [1])], r"schedule\[1\] has 1 weight for 2 sources"),
    ([(0, [1, 1]), (10, [0, 0])], r"schedule\[1\]: every weight is 0"),
    ([(0, [1, 1]), 7], r"schedule\[1\] must be a \(start_step, weights\) pair"),
    ([], "non-empty list"),
])
def test_bad_schedules(tmp_path, schedule, match):
    with pytest.raises((LoaderxValueError, LoaderxTypeError), match=match):
        mix(_sources(tmp_path, [10, 10]), schedule=schedule, batch_size=4)


def test_positions_out_of_range(tmp_path):
    m = mix(_sources(tmp_path, [10, 10]), [1, 1])
    with pytest.raises(LoaderxIndexError):
        m[[MIX_LENGTH]]
    with pytest.raises(LoaderxIndexError, match="endless"):
        m[5:]
    assert len(m) == MIX_LENGTH and m[3] == m[0:4][3]


def test_memory_is_the_table_not_the_run(tmp_path):
    m = mix(_sources(tmp_path, [10] * 10), np.random.default_rng(0).random(10))
    assert 1 << 15 <= m.period <= 1 << 16 and m.plan_bytes < 1 << 20
    plan = MixPlan(build_pieces([0], [Table(np.array([7, 2, 1]))], False), 3)
    assert plan.nbytes < 4096
