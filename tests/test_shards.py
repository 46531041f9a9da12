"""Sweeps spread over processes (`sweep --shard I/N`, one GPU each) and joined again (`attnbench
merge`); the float64 reference a configuration's passes share."""
import csv
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import PEAKS, PROVENANCE, FakeImpl, FakeTimer, host_inputs  # noqa: E402

from attnbench import check  # noqa: E402
from attnbench import sweep as sw  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.errors import BadInput  # noqa: E402
from attnbench.impls import PASSES  # noqa: E402
from attnbench.results import COLUMNS, ResultWriter, merge_results, read_results, row_key  # noqa: E402

SMALL = Path(__file__).parent / "data" / "small.csv"


# -- shards -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_shards_cover_the_plan_once_in_plan_order_with_passes_together(count):
    cases = sw.plan("training", T=(4096, 32768))
    shards = [sw.shard(cases, i, count) for i in range(1, count + 1)]
    assert sorted(map(cases.index, (c for s in shards for c in s))) == list(range(len(cases)))
    for s in shards:
        assert [cases.index(c) for c in s] == sorted(cases.index(c) for c in s)  # plan order
        groups = {}
        for c in s:
            groups.setdefault((c.inst, c.T, c.D), []).append(c.pass_name)
        assert all(p == list(PASSES) for p in groups.values())  # the three passes of a configuration together
    assert all(shards)  # 44 configurations: every shard has work


def test_shards_balance_the_estimated_time():
    cases = sw.plan("training", T=(4096, 131072))
    count = 4
    loads = [sum(sw.case_cost(c) for c in sw.shard(cases, i, count)) for i in range(1, count + 1)]
    biggest = max(sw.case_cost(c) * 3 for c in cases)  # a configuration's three passes cannot be split
    assert max(loads) - min(loads) <= biggest
    # the two dense configurations at T=131072 (the largest by far) go to different shards
    dense = [i for i in range(1, count + 1)
             if any(c.inst.pattern == "dense" and c.T == 131072 for c in sw.shard(cases, i, count))]
    assert len(dense) == 2


def test_case_cost_grows_with_the_work():
    (small,) = sw.plan("llm", T=(4096,), D=(64,), patterns=("dense",))
    (large,) = sw.plan("llm", T=(131072,), D=(64,), patterns=("dense",))
    (sparse,) = sw.plan("llm", T=(131072,), D=(64,), patterns=("block_diagonal",), block=(16,))
    assert sw.case_cost(large) > 10 * sw.case_cost(small) and sw.case_cost(small) > sw.case_cost(sparse)
    assert sw.SHARD_FIXED_S < sw.case_cost(sparse) < 2 * sw.SHARD_FIXED_S


@pytest.mark.parametrize("text, words", [("3", "is not I/N"), ("a/b", "is not I/N"), ("0/4", "I must be 1 to N"),
                                         ("5/4", "I must be 1 to N"), ("1/0", "I must be 1 to N"),
                                         ("1/2/3", "is not I/N")])
def test_a_bad_shard_is_refused_naming_the_option(text, words):
    with pytest.raises(BadInput, match="--shard") as e:
        sw.parse_shard(text)
    assert words in str(e.value)
    r = CliRunner().invoke(main, ["sweep", "--config", "training", "--T", "4096", "--shard", text,
                                  "--out", "never.csv"])
    assert r.exit_code == 2 and "--shard" in r.output and words in r.output
    assert not Path("never.csv").exists()


def test_parse_shard_takes_i_of_n():
    assert sw.parse_shard("2/4") == (2, 4) and sw.parse_shard("1/1") == (1, 1)


# -- one reference for a configuration's passes -----------------------------------------------------
def test_a_configurations_passes_share_one_reference_and_another_configuration_makes_its_own(monkeypatch):
    impls = [FakeImpl("fake-exact", passes=PASSES)]
    ctx = sw.Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                     cleanup=lambda: None)
    made = []
    real = check.reference_of
    monkeypatch.setattr(sw, "reference_of", lambda prob, *a, **kw: made.append(prob.pass_name) or real(prob, *a, **kw))
    bwd_first = ("bwd", "fwd+bwd", "fwd")
    for window in (4, 9):  # two configurations: their own inputs, their own references
        for case in sw.plan("seed", T=(32,), D=(16,), patterns=("window",), window=(window,), H=2, passes=bwd_first):
            (row,) = sw.run_case(case, impls, ctx)
            assert row["status"] == "ok" and row["rel_err"] <= 1e-6
    # the backward's gradients served the training step and (their output) the forward
    assert made == ["bwd", "bwd"] and ctx.references.computed == 2


def test_the_reused_reference_is_the_one_each_pass_would_make():
    (fwd, bwd, step) = sw.plan("seed", T=(24,), D=(16,), patterns=("streaming",), H=2, passes=PASSES)
    cache = sw.ReferenceCache()
    key = cache.key_of(bwd, 7)
    assert key == cache.key_of(fwd, 7) == cache.key_of(step, 7) != cache.key_of(bwd, 8)
    from attnbench.impls import Problem
    from attnbench.patterns import make_mask

    m = make_mask("streaming", 24, True, **fwd.inst.param_dict)
    probs = {c.pass_name: Problem(m, c.B, c.H, c.D, c.dtype, pass_name=c.pass_name) for c in (fwd, bwd, step)}
    q, k, v = check.problem_inputs(probs["fwd"], 7, host_inputs)
    do = check.grad_inputs(probs["bwd"], 7, host_inputs)["do"]
    grads = cache.get(key, True, lambda: check.reference_of(probs["bwd"], q, k, v, do))
    assert cache.get(key, True, lambda: pytest.fail("made again")) is grads
    np.testing.assert_array_equal(cache.get(key, False, lambda: pytest.fail("made again")),
                                  check.reference_of(probs["fwd"], q, k, v))
    cache.forget_unless(cache.key_of(bwd, 8))
    assert cache.ref is None and cache.key is None


# -- merge ------------------------------------------------------------------------------------------
def _rows(path=SMALL):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _write(path, rows):
    w = ResultWriter(path)
    with w:
        w.write(rows)
    return path


def test_merge_joins_shards_in_order(tmp_path):
    rows = _rows()
    a = _write(tmp_path / "a.csv", rows[:5])
    b = _write(tmp_path / "b.csv", rows[5:])
    out = tmp_path / "all.csv"
    r = CliRunner().invoke(main, ["merge", str(a), str(b), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"{len(rows)} rows from 2 files -> {out}" in r.output
    merged = _rows(out)
    assert [row_key(x) for x in merged] == [row_key(x) for x in rows]
    assert list(merged[0]) == COLUMNS  # this version's columns (the small CSV predates some)
    assert len(read_results(out)) == len(rows)


def test_merge_refuses_a_row_two_files_hold_unless_replace(tmp_path):
    rows = _rows()
    a = _write(tmp_path / "a.csv", rows[:4])
    changed = dict(rows[2], median_ms="123.5")
    b = _write(tmp_path / "b.csv", [changed] + rows[4:6])
    out = tmp_path / "all.csv"
    r = CliRunner().invoke(main, ["merge", str(a), str(b), "--out", str(out)])
    assert r.exit_code == 2 and "hold the same (configuration, implementation)" in r.output
    assert f"{b} line 2 and {a} line 4" in r.output and "--replace" in r.output
    assert not out.exists()
    r = CliRunner().invoke(main, ["merge", str(a), str(b), "--out", str(out), "--replace"])
    assert r.exit_code == 0 and "(1 replaced)" in r.output
    merged = _rows(out)
    assert len(merged) == 6 and merged[2]["median_ms"] == "123.5"  # in the earlier row's place


def test_merge_refuses_rows_of_another_gpu_and_records_cut_short(tmp_path):
    rows = _rows()
    a = _write(tmp_path / "a.csv", rows[:3])
    b = _write(tmp_path / "b.csv", [dict(r, gpu="Other GPU") for r in rows[3:5]])
    with pytest.raises(BadInput, match="is a row of 'Other GPU'.*merge the rows of one GPU"):
        merge_results([a, b], tmp_path / "out.csv")
    cut = tmp_path / "cut.csv"
    cut.write_bytes(a.read_bytes() + b"2026-11-26T00:00:00Z,half a row")
    with pytest.raises(BadInput, match="line 5: cut short.*--resume"):
        merge_results([cut], tmp_path / "out.csv")
    with pytest.raises(BadInput, match="does not exist"):
        merge_results([tmp_path / "missing.csv"], tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()


def test_a_failed_row_retried_in_the_same_file_is_replaced_without_replace(tmp_path):
    rows = _rows()
    failed = dict(rows[0], status="failed", reason="out of memory", median_ms="")
    p = tmp_path / "retried.csv"
    with open(p, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows([failed, rows[1], rows[0]])
    n, replaced = merge_results([p], tmp_path / "out.csv")
    assert (n, replaced) == (2, 0)
    assert [x["status"] for x in _rows(tmp_path / "out.csv")] == ["ok", "ok"]
