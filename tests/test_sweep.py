"""Sweeps without a GPU: plans, gating, skip and failure rows, interleaved timing, resume, CLI."""
import json
import re
import csv
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import PEAKS, PROVENANCE, FakeImpl, FakeTimer, fake_impls, host_inputs  # noqa: E402

from attnbench import sweep as sw  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.patterns import PATTERNS, BadInput  # noqa: E402
from attnbench.results import ResultWriter, row_key  # noqa: E402
from attnbench.timing import (HOLD_MARGIN, HOLD_MAX_US, HOLD_US, HostOutranHold, Timing, next_hold_us,  # noqa: E402
                              summarize, time_interleaved)


def ctx_for(impls, **kw):
    timer = FakeTimer(impls)
    return sw.Context(time=timer, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                      cleanup=lambda: None, **kw), timer


# -- plans --------------------------------------------------------------------------------

SEED_PATTERNS = {"dense", "window", "streaming", "block_diagonal", "dilated", "bigbird"}


def test_seed_plan_is_every_seed_pattern_at_its_defaults():
    cases = sw.plan("seed")
    assert sorted({c.T for c in cases}) == [128, 256, 512, 1024, 2048, 4096]
    assert {(c.B, c.H, c.D, c.dtype) for c in cases} == {(1, 1, 384, "float32")}
    insts = {c.inst for c in cases}
    assert {i.pattern for i in insts} == SEED_PATTERNS
    assert all(i.causal for i in insts)
    assert all(i.param_dict == PATTERNS[i.pattern].defaults() for i in insts)
    assert len(cases) == len(SEED_PATTERNS) * 6


def test_a_pattern_the_config_does_not_hold_runs_at_its_defaults_and_causal_flag():
    (inst,) = sw.instances("llm", ("prefix_lm",))
    assert (inst.param_dict, inst.causal) == (PATTERNS["prefix_lm"].defaults(), False)
    assert [i.causal for i in sw.instances("seed", ("prefix_lm",))] == [True]  # the seed's tables are causal


def test_llm_plan_is_spec_section_5():
    cases = sw.plan("llm")
    assert sorted({c.T for c in cases}) == [4096, 32768, 131072]
    assert {(c.B, c.H, c.D, c.dtype) for c in cases} == {(1, 16, 64, "bfloat16"), (1, 16, 128, "bfloat16")}
    got = {(i.pattern, tuple((k, v) for k, v in i.params if k != "seed"), i.causal) for i in {c.inst for c in cases}}
    assert got == {
        ("dense", (), True),
        ("streaming", (("sink", 16), ("window", 64)), True),
        ("streaming", (("sink", 4), ("window", 1024)), True),
        ("window", (("window", 256),), True),
        ("window", (("window", 4096),), True),
        ("block_diagonal", (("block", 16),), False),
        ("block_diagonal", (("block", 128),), False),
        ("dilated", (("dilation", 2), ("levels", ()), ("window", 512)), True),
        ("bigbird", (("block", 64), ("global_blocks", 1), ("random_blocks", 3), ("window_blocks", 3)), True),
        ("document", (("doc_lens", ()), ("doc_mean", 2048), ("doc_seed", 0), ("window", 0)), True),
        ("dilated", (("dilation", 1), ("levels", ((2048, 2), (2048, 4))), ("window", 2048)), True),
        ("custom", (("expr", "(j < 16) | (i - j < 64)"), ("param", ())), True),
        ("custom", (("expr", "i - j < 256"), ("param", ())), True),
        ("custom", (("expr", "i // 128 == j // 128"), ("param", ())), False),
    }
    assert sorted({c.T for c in sw.plan("llm", T_min=1024, T_max=2048)}) == [1024, 2048]


def test_parameter_options_take_the_product_per_pattern():
    insts = sw.instances("seed", ("dense", "window", "streaming", "dilated"), window=(32, 64), sink=(4, 8),
                         dilation=(3,))
    by = {}
    for i in insts:
        by.setdefault(i.pattern, []).append(i.param_dict)
    assert by["dense"] == [{}]
    assert sorted(p["window"] for p in by["window"]) == [32, 64]
    assert sorted((p["sink"], p["window"]) for p in by["streaming"]) == [(4, 32), (4, 64), (8, 32), (8, 64)]
    assert sorted((p["window"], p["dilation"]) for p in by["dilated"]) == [(32, 3), (64, 3)]
    assert all(i.causal for i in insts)
    assert not any(i.causal for i in sw.instances("seed", ("window",), causal=False))


def test_a_pattern_no_option_applies_to_keeps_the_configs_instances():
    """--window 256 beside --pattern custom and --pattern bigbird: window takes the option; custom and
    bigbird take none of it and sweep the config's own instances (custom's three expressions), as they
    would without the option."""
    from attnbench.configs import get_config

    insts = sw.instances("training", ("window", "custom", "bigbird"), window=(256,))
    own = [i for i in get_config("training").instances if i.pattern in ("custom", "bigbird")]
    assert [i.param_dict for i in insts if i.pattern == "window"] == [{"window": 256}]
    assert [i for i in insts if i.pattern != "window"] == [i for i in own if i.pattern == "custom"] + [
        i for i in own if i.pattern == "bigbird"]
    assert len([i for i in insts if i.pattern == "custom"]) == 3
    # a pattern the config does not hold: at its defaults
    assert [i.param_dict for i in sw.instances("decode", ("custom",), window=(256,))] == [
        sw.Instance.make("custom", True).param_dict]


@pytest.mark.parametrize("kw, match", [
    (dict(T_min=512, T_max=256), "T-min"),
    (dict(T_min=300, T_max=500), "power of two"),
    (dict(dtype=("float64",)), "dtype"),
    (dict(B=0), "B=0"),
    (dict(patterns=("nope",)), "pattern"),
])
def test_bad_plans_are_refused(kw, match):
    with pytest.raises(BadInput, match=match):
        sw.plan("seed", **kw)


def test_unknown_impl_names_the_choices(registry):
    with pytest.raises(BadInput, match="fake-exact"):
        sw.select_impls(("nope",))
    assert [i.name for i in sw.select_impls(("fake-peer", "fake-exact"))] == ["fake-peer", "fake-exact"]


# -- one configuration ---------------------------------------------------------------------

def case(pattern="streaming", T=64, dtype="float32", D=16, **params):
    return sw.Case("seed", sw.Instance.make(pattern, True, **params), T, 1, 2, D, dtype)


def test_rows_of_a_configuration_gate_skip_fail_and_time():
    impls = fake_impls()
    ctx, timer = ctx_for(impls)
    rows = {r["impl"]: r for r in sw.run_case(case(), impls, ctx)}
    assert list(rows) == [i.name for i in impls]
    st = {n: (r["status"], r["reason"]) for n, r in rows.items()}
    assert st["fake-exact"] == ("ok", "")
    assert st["fake-peer"] == ("ok", "")
    assert st["fake-wrong"][0] == "failed" and "above tolerance" in st["fake-wrong"][1]
    assert st["fake-oom"] == ("failed", "MemoryError: out of memory allocating 1 GiB (fake)")
    assert st["fake-absent"] == ("skipped", "fake: needs a library that is not installed")
    assert st["fake-f16"][0] == "skipped" and "dtype=float32" in st["fake-f16"][1]
    # the implementations that passed were timed together, once, and nothing else was
    assert timer.calls == [["fake-exact", "fake-peer", "fake-slow"]]
    assert all(rows[n].get("median_ms") is None for n in ("fake-wrong", "fake-oom", "fake-absent", "fake-f16"))
    assert rows["fake-exact"]["rel_err"] <= rows["fake-exact"]["tolerance"]
    assert rows["fake-slow"]["median_ms"] == pytest.approx(4 * rows["fake-exact"]["median_ms"])


def test_a_configuration_that_does_not_fit_is_skipped_for_every_impl():
    impls = fake_impls()
    ctx, timer = ctx_for(impls)
    rows = sw.run_case(case("block_diagonal", T=32, block=64), impls, ctx)
    assert {r["status"] for r in rows} == {"skipped"}
    assert all("block=64" in r["reason"] for r in rows)
    assert timer.calls == [] and all(i.prepared == 0 for i in impls)


def test_a_configuration_whose_inputs_exceed_the_device_is_skipped_before_any_allocation():
    """The device's memory known (the real context's ``device_bytes``): a case whose q, k, v and output alone take
    more is skipped for every candidate, its reason giving both sizes, and no input is made; one that fits runs."""
    from attnbench.memory import needed_bytes

    impls = [FakeImpl("a"), FakeImpl("b", unavailable="no")]
    made = []

    def inputs(*a, **kw):
        made.append(a)
        return host_inputs(*a, **kw)

    c = case()
    prob = sw.Problem(sw.make_mask(c.inst.pattern, c.T, c.inst.causal, **c.inst.param_dict), c.B, c.H, c.D, c.dtype)
    need = needed_bytes(prob)
    assert need == 4 * c.B * c.H * c.T * c.D * (4 if c.dtype == "float32" else 2)  # q, k, v and O
    ctx = sw.Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=inputs,
                     cleanup=lambda: None, device_bytes=need - 1)
    st = {r["impl"]: (r["status"], r["reason"]) for r in sw.run_case(c, impls, ctx)}
    assert st["b"] == ("skipped", "no") and st["a"][0] == "skipped", st
    assert f"{need / 1e9:.1f} GB" in st["a"][1] and "more than the device's" in st["a"][1]
    assert made == [] and impls[0].prepared == 0
    ctx.device_bytes = need
    assert {r["impl"]: r["status"] for r in sw.run_case(c, impls, ctx)}["a"] == "ok" and made


def test_an_exception_while_timing_fails_that_impl_only():
    impls = [FakeImpl("a"), FakeImpl("b")]

    def time(runs, budget_s=None):
        return {"a": Timing(1.0, 0.9, 1.1, 10), "b": RuntimeError("launch failed")}

    ctx = sw.Context(time=time, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                     cleanup=lambda: None)
    rows = {r["impl"]: r for r in sw.run_case(case(), impls, ctx)}
    assert rows["a"]["status"] == "ok" and rows["a"]["median_ms"] == 1.0
    assert rows["b"]["status"] == "failed" and rows["b"]["reason"] == "timing: RuntimeError: launch failed"


@pytest.mark.parametrize("hold, grew", [(HOLD_US, False), (1400.0, True)])
def test_a_row_says_the_hold_only_where_its_host_path_outgrew_the_default(hold, grew):
    impls = [FakeImpl("a")]

    def time(runs, budget_s=None):
        return {"a": Timing(1.0, 0.9, 1.1, 10, hold_us=hold)}

    ctx = sw.Context(time=time, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                     cleanup=lambda: None)
    (row,) = sw.run_case(case(), impls, ctx)
    setup = json.loads(row["setup_s"])
    assert row["status"] == "ok"
    assert setup.get("hold_us") == (1400.0 if grew else None)


class Logged(FakeImpl):
    """A FakeImpl that appends "prepare NAME" to ``log`` as it prepares."""

    def __init__(self, name, log):
        super().__init__(name)
        self.log = log

    def prepare(self, prob, q, k, v, do=None):
        self.log.append(f"prepare {self.name}")
        return super().prepare(prob, q, k, v, do)


def test_the_reference_s_temporaries_go_back_before_the_next_implementation_prepares():
    log = []
    impls = [Logged("a", log), Logged("b", log)]
    ctx, _ = ctx_for(impls)
    ctx.cleanup = lambda: log.append("cleanup")
    rows = sw.run_case(case(), impls, ctx)
    assert {r["status"] for r in rows} == {"ok"}
    # one reference, made after the first prepare: the device memory it left is given back before b's
    assert log[:3] == ["prepare a", "cleanup", "prepare b"]
    assert ctx.references.computed == 1


def test_the_device_settles_after_the_gates_and_before_the_timing():
    log = []
    impls = [Logged("a", log), Logged("b", log)]
    timer = FakeTimer(impls)

    def time(runs, **kw):
        log.append("time " + " ".join(runs))
        return timer(runs, **kw)

    ctx = sw.Context(time=time, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs, cleanup=lambda: None,
                     settle=lambda: log.append("settle"))
    rows = sw.run_case(case(), impls, ctx)
    assert {r["status"] for r in rows} == {"ok"}
    assert log == ["prepare a", "prepare b", "settle", "time a b"]
    # a configuration with nothing to time does not wait
    log.clear()
    rows = sw.run_case(case(), [FakeImpl("w", factor=2.0)], ctx)
    assert rows[0]["status"] == "failed" and log == []


def test_the_device_context_pauses_between_gate_and_timing(monkeypatch):
    import time as _time

    from attnbench import timing

    from attnbench import impls, memory, results

    slept = []
    monkeypatch.setattr(_time, "sleep", slept.append)
    sw.settle()
    assert slept == [timing.SETTLE_S] and timing.SETTLE_S > 0
    # the context a device sweep runs with pauses so (the device's parts stood in for)
    monkeypatch.setattr(impls, "device_problem", lambda: None)
    monkeypatch.setattr(results, "provenance", lambda: dict(PROVENANCE))
    monkeypatch.setattr(timing, "measure_peaks", lambda: PEAKS)
    monkeypatch.setattr(timing, "EventTimer", lambda: types.SimpleNamespace(time=None))
    monkeypatch.setattr(memory, "device_bytes", lambda: 80 << 30)
    ctx = sw.device_context()
    assert ctx.settle is sw.settle
    assert ctx.device_bytes == 80 << 30  # ... and knows the device's memory, so a case that cannot fit is skipped


def test_failed_inputs_fail_every_candidate():
    impls = [FakeImpl("a"), FakeImpl("b", unavailable="no")]

    def inputs(*a):
        raise MemoryError("out of memory")

    ctx = sw.Context(time=None, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=inputs, cleanup=lambda: None)
    st = {r["impl"]: (r["status"], r["reason"]) for r in sw.run_case(case(), impls, ctx)}
    assert st == {"a": ("failed", "inputs: MemoryError: out of memory"), "b": ("skipped", "no")}


# -- whole sweeps and resume -------------------------------------------------------------------

def small_plan():
    return sw.plan("seed", patterns=("dense", "window", "block_diagonal"), T_min=32, T_max=64, B=1, H=1, D=(16,),
                   window=(8,), block=(16, 64))


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_resume_after_an_interrupt_loses_no_finished_row_and_writes_none_twice(tmp_path):
    cases, out = small_plan(), tmp_path / "r.csv"
    impls = fake_impls()

    def interrupt_at_3(done, total, c):
        if done == 3:
            raise KeyboardInterrupt

    ctx, _ = ctx_for(impls, progress=interrupt_at_3)
    with pytest.raises(KeyboardInterrupt):
        with ResultWriter(out) as w:
            sw.run_sweep(cases, impls, w, ctx)
    first = read(out)
    assert len(first) == 3 * len(impls)  # every row of the three finished configurations
    prepared = {i.name: i.prepared for i in impls}

    ctx, _ = ctx_for(impls)
    with ResultWriter(out, resume=True) as w:
        counts = sw.run_sweep(cases, impls, w, ctx)
    assert counts["resumed"] == 3 * len(impls)
    rows = read(out)
    assert rows[:len(first)] == first
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == len(cases) * len(impls)
    # configurations already done were not prepared again
    again = {i.name: i.prepared - prepared[i.name] for i in impls}
    assert again["fake-exact"] == len(cases) - 3 - sum(1 for c in cases[3:] if c.inst.param_dict.get("block") == 64
                                                      and c.T == 32)


# -- the adaptive, interleaved timing loop ---------------------------------------------------------

class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_timing_interleaves_and_stops_once_settled():
    order = []
    clock = Clock()

    def sample(fn):
        order.append(fn.__name__)
        clock.t += 0.001
        return 2.0

    def a():
        pass

    def b():
        pass

    out = time_interleaved({"a": a, "b": b}, sample, min_samples=5, warmup=0, clock=clock)
    assert order[:6] == ["a", "b", "b", "a", "a", "b"]  # one sample each a round, each round one name later
    assert out["a"] == Timing(2.0, 2.0, 2.0, 5) and out["b"].samples == 5


def test_every_name_takes_every_place_in_a_round_alike():
    """With a fixed count of samples, each of three names is sampled first, second and third in a round equally
    often, and follows each other name at least twice."""
    from collections import Counter

    order = []

    def sample(fn):
        order.append(fn.__name__)
        return 1.0

    def a():
        pass

    def b():
        pass

    def c():
        pass

    time_interleaved({"a": a, "b": b, "c": c}, sample, samples=9, warmup=0)
    assert len(order) == 27
    places = Counter((name, i % 3) for i, name in enumerate(order))
    assert set(places.values()) == {3} and len(places) == 9
    follows = Counter(zip(order, order[1:]))
    assert all(follows[x, y] >= 2 for x in "abc" for y in "abc" if x != y), follows


def test_timing_takes_more_samples_while_noisy_until_the_budget():
    clock = Clock()
    values = iter([1.0, 3.0] * 1000)

    def sample(fn):
        clock.t += 0.1
        return next(values)

    out = time_interleaved({"x": lambda: None}, sample, min_samples=4, budget_s=1.0, warmup=0, clock=clock)
    assert 10 <= out["x"].samples <= 12
    assert out["x"].p20_ms == 1.0 and out["x"].p80_ms == 3.0


def test_timing_warms_up_and_keeps_going_past_a_failing_runner():
    calls = []

    def bad():
        raise RuntimeError("boom")

    out = time_interleaved({"bad": bad, "ok": lambda: calls.append(1)}, lambda fn: (fn(), 1.0)[1],
                           min_samples=3, warmup=2)
    assert isinstance(out["bad"], RuntimeError)
    assert out["ok"].samples == 3 and len(calls) == 2 + 3


def test_a_sample_the_host_issued_within_the_hold_stands():
    assert next_hold_us(HOLD_US, HOLD_MARGIN * HOLD_US) is None
    assert next_hold_us(HOLD_US, 10.0) is None


def test_a_host_path_past_the_hold_takes_the_sample_again_behind_twice_its_time():
    issued = 1234.0  # a compiled forward and its autograd backward, issued in 1.2 ms
    longer = next_hold_us(HOLD_US, issued)
    assert longer == 2 * issued
    assert next_hold_us(longer, issued) is None  # behind that hold the same path is hidden
    assert next_hold_us(HOLD_US, HOLD_MARGIN * HOLD_US + 1) == 2 * HOLD_US  # just past: at least twice the hold


def test_a_host_path_longer_than_the_longest_hold_fails_the_timing():
    assert next_hold_us(HOLD_MAX_US / 2, HOLD_MAX_US) == HOLD_MAX_US
    with pytest.raises(HostOutranHold, match="longest hold"):
        next_hold_us(HOLD_MAX_US, HOLD_MAX_US)


def test_summary_percentiles():
    t = summarize([5, 1, 4, 2, 3])
    assert (t.median_ms, t.samples) == (3.0, 5)
    assert t.p20_ms == pytest.approx(1.8) and t.p80_ms == pytest.approx(4.2)


# -- the command line -----------------------------------------------------------------------------

@pytest.fixture
def no_device(monkeypatch):
    def refuse(**kw):
        raise AssertionError("the device was touched")
    monkeypatch.setattr(sw, "device_context", refuse)


@pytest.mark.parametrize("args, match", [
    (["--impl", "nope"], "'--impl': 'nope' is not one of 'fake-exact'"),
    (["--T-min", "512", "--T-max", "128"], "T-min"),
    (["--block", "0"], "--block=0 is below its minimum 1"),
    (["--time-budget", "0"], "time-budget"),
    (["--dtype", "float64"], "'--dtype': 'float64' is not one of 'float32'"),
    (["--pattern", "diagonal"], "'--pattern': 'diagonal' is not one of 'dense'"),
    (["--config", "huge"], "'--config': 'huge' is not one of 'seed', 'llm'"),
])
def test_sweep_bad_input_exits_2_before_any_launch(tmp_path, registry, no_device, args, match):
    r = CliRunner().invoke(main, ["sweep", "--out", str(tmp_path / "r.csv")] + args)
    assert r.exit_code == 2, r.output
    assert "error: " in r.stderr.lower() and match in r.stderr
    assert "Traceback" not in r.output


def test_sweep_refuses_an_existing_csv_without_resume(tmp_path, registry, no_device):
    out = tmp_path / "r.csv"
    out.write_text("x\n")
    r = CliRunner().invoke(main, ["sweep", "--out", str(out)])
    assert r.exit_code == 2 and "--resume" in r.stderr


def test_sweep_command_end_to_end_with_fakes(tmp_path, registry, monkeypatch):
    made = {}

    def fake_context(seed, budget_s, command, progress, samples=None):
        ctx, timer = ctx_for(list(registry.values()), seed=seed, budget_s=budget_s, command=command,
                             progress=progress, samples=samples)
        made["ctx"] = ctx
        return ctx

    monkeypatch.setattr(sw, "device_context", fake_context)
    out = tmp_path / "r.csv"
    r = CliRunner().invoke(main, ["sweep", "--T-min", "32", "--T-max", "64", "--pattern", "dense", "--pattern",
                                  "window", "--window", "8", "--D", "16", "--impl", "fake-exact", "--impl",
                                  "fake-wrong", "--time-budget", "0.5", "--out", str(out)])
    assert r.exit_code == 1, r.output  # fake-wrong failed the gate: no false pass
    assert "checked 8, passed 4, failed 4, skipped 0 -> " in r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == f"error: 4 of 8 rows failed (their reasons are in {out})"
    rows = read(out)
    assert [(x["pattern"], x["T"], x["impl"], x["status"]) for x in rows] == [
        ("dense", "32", "fake-exact", "ok"), ("dense", "32", "fake-wrong", "failed"),
        ("window", "32", "fake-exact", "ok"), ("window", "32", "fake-wrong", "failed"),
        ("dense", "64", "fake-exact", "ok"), ("dense", "64", "fake-wrong", "failed"),
        ("window", "64", "fake-exact", "ok"), ("window", "64", "fake-wrong", "failed")]
    assert made["ctx"].budget_s == 0.5
    assert all(x["command"].startswith("attnbench ") for x in rows)
    assert re.search(r"\[4/4 done, 0 left, 0m\d\ds spent\] finished", r.stderr)


def test_progress_says_time_spent_and_an_estimate_of_what_is_left():
    lines, t = [], iter([0.0, 30.0, 60.0, 90.0])

    class Stream:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    p = sw.Progress(Stream(), clock=lambda: next(t))
    case = sw.plan("seed", patterns=("dense",), T=(128,))[0]
    p(0, 3, case)
    p(1, 3, case)
    p(2, 3, case)
    p(3, 3, None)
    assert lines[1].startswith("[1/3 done, 2 left, 0m30s spent, about 1m00s left] dense causal T=128")
    assert lines[2].startswith("[2/3 done, 1 left, 1m00s spent, about 0m30s left]")
    assert lines[3].startswith("[3/3 done, 0 left, 1m30s spent] finished")


def test_progress_weighs_its_estimate_by_each_configurations_estimated_cost():
    """With a cost per configuration, the estimate is the seconds spent per estimated second on the
    configurations that ran, times the estimate of those left; resumed ones count for neither."""
    lines, t = [], iter([0.0, 0.0, 100.0, 100.0, 110.0, 110.0])

    class Stream:
        def write(self, s):
            lines.append(s)

        def flush(self):
            pass

    cases = sw.plan("seed", patterns=("dense",), T=(128, 256, 512, 1024))
    cost = dict(zip(cases, (1.0, 10.0, 1.0, 4.0)))
    p = sw.Progress(Stream(), clock=lambda: next(t), cost=cost.__getitem__)
    p.plan(cases)
    p(0, 4, cases[0])
    p.finished(cases[0], ran=False)  # resumed: no time, no rate
    p(1, 4, cases[1])
    p.finished(cases[1], ran=True)  # 100 s for 10 estimated: 10 s each
    p(2, 4, cases[2])
    assert "about 0m50s left" in lines[-1]  # (1 + 4) estimated seconds left at 10 s each
    p.finished(cases[2], ran=True)  # 10 s more for 1 estimated: 110 s per 11
    p(3, 4, cases[3])
    assert "about 0m40s left" in lines[-1]
    assert "about" not in lines[0] and "about" not in lines[1]  # nothing ran yet: no estimate


def test_the_bytes_floor_takes_the_better_of_copy_and_read_bandwidth():
    """A kernel that mostly reads can beat the copy bandwidth: the floor must not be below it."""
    import dataclasses

    impls = [FakeImpl("fake-exact")]
    case = sw.plan("seed", patterns=("window",), T=(64,), B=1, H=1, D=(16,))[0]
    for read, expect in ((0.0, PEAKS.copy_tbps), (3.0 * PEAKS.copy_tbps, 3.0 * PEAKS.copy_tbps)):
        ctx, _ = ctx_for(impls)
        ctx.peaks = dataclasses.replace(PEAKS, read_tbps=read)
        (row,) = sw.run_case(case, impls, ctx)
        assert row["peak_tbps"] == expect
        mem_ms = row["bytes_floor"] / (expect * 1e12) * 1e3
        assert row["floor_ms"] == max(row["flops"] / (row["peak_tflops"] * 1e12) * 1e3, mem_ms)
