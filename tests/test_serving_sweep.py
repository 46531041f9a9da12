"""Serving shapes through the sweep, the CSV and the command line, without a GPU: the decode
configuration's plan, rows that name H_kv, Tq and cache_lens, skips with reasons for the
implementations that take prefill only, CSVs of before read and resumed as prefill."""
import csv
import io
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import FakeImpl  # noqa: E402
from test_sweep import ctx_for  # noqa: E402
from test_trust import device, one_error  # noqa: E402,F401

from attnbench import sweep as sw  # noqa: E402
from attnbench.errors import BadInput  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.impls import Problem  # noqa: E402
from attnbench.patterns import make_mask  # noqa: E402
from attnbench.results import COLUMNS, ResultWriter, read_results, row_key  # noqa: E402

SMALL = Path(__file__).parent / "data" / "small.csv"
DECODE = ["--T", "64", "--pattern", "dense", "--pattern", "window", "--window", "8", "--D", "16", "--B", "2",
          "--H", "4", "--H-kv", "2", "--Tq", "1", "--Tq", "4"]


def serving_fake(name="fake-serving"):
    impl = FakeImpl(name)
    impl.gqa = impl.decode = impl.ragged = True
    return impl


def test_decode_plan_is_spec_section_5():
    cases = sw.plan("decode")
    assert {(c.H, c.H_kv, c.D, c.dtype) for c in cases} == {(32, 8, 128, "bfloat16")}
    plain = [c for c in cases if c.cache_lens is None]
    assert {(c.B, c.Tq) for c in plain} == {(b, q) for b in (1, 8, 64) for q in (1, 16)}
    assert {c.T for c in plain} == {4096, 32768, 131072, 1048576}
    assert {c.inst.pattern for c in plain if c.T == 1048576} == {"streaming", "window", "dilated", "bigbird"}
    insts = {c.inst for c in cases}
    assert {(i.pattern, tuple(v for k, v in i.params if k in ("sink", "window"))) for i in insts} >= {
        ("streaming", (4, 1024)), ("streaming", (16, 64)), ("window", (4096,)), ("dense", ())}
    ragged = [c for c in cases if c.cache_lens is not None]
    assert len(ragged) == len(insts) and all(len(c.cache_lens) == c.B for c in ragged)
    assert all(len(set(c.cache_lens)) > 1 and max(c.cache_lens) <= c.T for c in ragged)
    assert len(set(cases)) == len(cases)
    for c in cases[:3] + ragged[:1]:  # the problems are valid as planned
        Problem(c.inst.mask(c.T), c.B, c.H, c.D, c.dtype, H_kv=c.H_kv, Tq=c.Tq, cache_lens=c.cache_lens)


def test_several_batches_are_each_a_configuration():
    cases = sw.plan("decode", patterns=("dense",), T=(32768,), B=(1, 8), Tq=(1,))
    assert sorted(c.B for c in cases) == [1, 8]
    assert sorted(c.B for c in sw.plan("llm", patterns=("dense",), T=(4096,), D=(64,), B=(2, 3))) == [2, 3]
    assert [c.B for c in sw.plan("llm", patterns=("dense",), T=(4096,), D=(64,), B=5)] == [5]
    with pytest.raises(BadInput, match="B=0"):
        sw.plan("decode", B=(1, 0))


def test_prefill_plans_are_unchanged():
    for cfg in ("seed", "llm"):
        assert all(c.H_kv is None and c.Tq is None and c.cache_lens is None for c in sw.plan(cfg))


def test_decode_rows_skip_prefill_impls_with_reasons_and_check_the_others():
    impls = [FakeImpl("fake-exact"), serving_fake()]
    ctx, _ = ctx_for(impls)
    for case in sw.plan("seed", T=(64,), patterns=("window", "streaming"), D=(16,), H=4, B=3, H_kv=2, Tq=(4,),
                        cache_dist="uniform", cache_seed=1):
        rows = sw.run_case(case, impls, ctx)
        skipped, ok = rows
        assert skipped["status"] == "skipped" and "H_kv=2 < H=4" in skipped["reason"]
        assert "fake-exact" in skipped["reason"], skipped["reason"]
        assert ok["status"] == "ok", ok["reason"]
        assert (ok["H_kv"], ok["Tq"], ok["T"]) == (2, 4, 64) and ok["cache_lens"].count(",") == 2
        prob = Problem(case.inst.mask(64), 3, 4, 16, "float32", H_kv=2, Tq=4, cache_lens=case.cache_lens)
        assert (ok["pairs"], ok["flops"], ok["bytes_floor"]) == (prob.pairs, prob.flops, prob.bytes_floor)
        assert row_key(ok) != row_key(dict(ok, Tq=64, cache_lens=""))


def test_prefill_rows_name_their_shape_as_before(tmp_path):
    impls = [FakeImpl("fake-exact")]
    ctx, _ = ctx_for(impls)
    (case,) = sw.plan("seed", T=(32,), patterns=("dense",), D=(16,))
    (row,) = sw.run_case(case, impls, ctx)
    assert (row["H_kv"], row["Tq"], row["cache_lens"]) == (1, 32, "")
    assert row_key(row) == row_key({k: v for k, v in row.items() if k not in ("H_kv", "Tq", "cache_lens")})


def test_a_csv_of_before_reads_and_resumes_as_prefill(tmp_path):
    df = read_results(SMALL)
    assert (df["H_kv"] == df["H"]).all() and (df["Tq"] == df["T"]).all() and (df["cache_lens"] == "").all()
    path = tmp_path / "old.csv"
    shutil.copy(SMALL, path)
    with ResultWriter(path, resume=True) as w:
        done = len(w.done)
        with open(SMALL, newline="") as f:
            assert all(w.is_done(r) for r in csv.DictReader(f))
    with open(path, newline="") as f:
        header = next(csv.reader(f))
        rows = list(csv.DictReader(io.StringIO(Path(path, newline="").read_text())))
    assert header == COLUMNS and len(rows) == done
    assert all(r["H_kv"] == r["H"] and r["Tq"] == r["T"] and r["cache_lens"] == "" for r in rows)


def test_decode_sweep_on_the_command_line(tmp_path, device, registry):
    registry["fake-serving"] = serving_fake()
    out = tmp_path / "d.csv"
    r = CliRunner().invoke(main, ["sweep", *DECODE, "--impl", "fake-exact", "--impl", "fake-serving",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = read_results(out)
    assert sorted(set(df["Tq"])) == [1, 4] and set(df["H_kv"]) == {2}
    assert set(df[df.impl == "fake-serving"]["status"]) == {"ok"}
    assert set(df[df.impl == "fake-exact"]["status"]) == {"skipped"}
    r = CliRunner().invoke(main, ["sweep", *DECODE, "--impl", "fake-exact", "--impl", "fake-serving",
                                  "--out", str(out), "--resume"])
    assert "resumed 8" in r.output, r.output
    r = CliRunner().invoke(main, ["sweep", *DECODE, "--cache-dist", "uniform", "--impl", "fake-serving",
                                  "--out", str(out), "--resume"])
    assert r.exit_code == 0, r.output
    assert (read_results(out)["cache_lens"] != "").sum() == 4


@pytest.mark.parametrize("args, words", [
    (["--H-kv", "0"], ["--H-kv=0"]),
    (["--Tq", "0"], ["--Tq=0"]),
    (["--cache-lens", "8,x"], ["--cache-lens"]),
    (["--cache-lens", "8,16,32"], ["--cache-lens", "3", "--B=2"]),
    (["--B", "1", "--B", "2", "--cache-lens", "8,16"], ["--cache-lens", "--B=1,2"]),
    (["--B", "1", "--cache-lens", "128"], ["--cache-lens", "128", "T=64"]),
    (["--cache-dist", "zipf"], ["--cache-dist"]),
])
def test_bad_serving_options_are_refused_before_any_device(args, words, registry, monkeypatch):
    def no_device(*a, **k):
        raise AssertionError("a device was asked for")
    monkeypatch.setattr(sw, "device_context", no_device)
    a = list(DECODE)
    for opt in ("--B", "--H-kv"):  # given once (a second is refused by name): args' own replaces DECODE's
        if opt in args:
            at = a.index(opt)
            del a[at:at + 2]
    a += args
    r = CliRunner().invoke(main, ["sweep", *a, "--impl", "fake-exact", "--out", "x.csv"])
    one_error(r, *words)


def test_check_and_run_refuse_bad_serving_shapes_by_name(registry):
    r = CliRunner().invoke(main, ["check", "--impl", "fake-exact", "--H", "4", "--H-kv", "3"])
    one_error(r, "H_kv=3", "H=4")
    r = CliRunner().invoke(main, ["run", "--impl", "fake-exact", "--T", "64", "--Tq", "65"])
    one_error(r, "Tq=65", "T=64")


def test_check_runs_the_gate_on_serving_shapes(registry, monkeypatch):
    from fakes import host_inputs

    from attnbench import check as check_mod

    monkeypatch.setattr(check_mod, "random_inputs", host_inputs)
    registry["fake-serving"] = serving_fake()
    r = CliRunner().invoke(main, ["check", "--impl", "fake-serving", "--impl", "fake-exact", "--pattern", "window",
                                  "--T", "64", "--H", "4", "--H-kv", "2", "--Tq", "3", "--cache-dist", "uniform"])
    assert r.exit_code == 0, r.output
    assert "failed 0" in r.output and "skipped" in r.output and "H_kv=2 < H=4" in r.output


def test_batches_and_query_lengths_given_narrow_the_long_caches_and_the_ragged_batch():
    """--B and --Tq narrow the decode configuration's extra cases as they do its grid: no longest cache for a batch
    above the configuration's (B=64 at T=1048576 would not fit), and the ragged batch (B=8, Tq=1) only where its B
    and Tq are among those given."""
    b64 = sw.plan("decode", B=(64,), Tq=(16,))
    assert {c.B for c in b64} == {64} and {c.T for c in b64} == {4096, 32768, 131072}
    assert all(c.cache_lens is None for c in b64)
    assert not [c for c in sw.plan("decode", Tq=(16,)) if c.cache_lens is not None]
    b8 = sw.plan("decode", B=(8,), Tq=(1,))
    assert 1048576 in {c.T for c in b8}
    assert {(c.B, c.Tq) for c in b8 if c.cache_lens is not None} == {(8, 1)}
    assert 1048576 in {c.T for c in sw.plan("decode", B=(4,))}  # (a smaller batch than the config's fits too)


def test_keys_beyond_a_short_cache_never_reach_a_ragged_problem():
    p = Problem(make_mask("window", 64, True, window=8), 2, 2, 16, "float32", Tq=2, cache_lens=(64, 16))
    assert p.pairs == 2 * (8 + 8)


def test_every_decode_case_fits_its_cache_in_one_gpu():
    """K and V of the decode configuration's largest cases stay within an H100's 80 GB (B=64 at
    T=1048576 would need 275 GB: the config keeps the longest caches for B 1 and 8)."""
    from attnbench.sweep import plan

    cases = plan("decode")
    assert {c.T for c in cases} >= {1048576} and {c.B for c in cases} >= {64}
    for c in cases:
        kv_bytes = 2 * c.B * c.H_kv * c.T * c.D * 2
        assert kv_bytes < 40e9, c.describe()


def test_a_key_value_head_count_that_does_not_divide_H_is_refused_by_name():
    from attnbench.errors import BadInput
    from attnbench.sweep import plan

    with pytest.raises(BadInput, match=r"--H-kv=3 must divide the query heads H=16"):
        plan("llm", T=(4096,), H_kv=3)
    assert plan("llm", T=(4096,), H_kv=4)
