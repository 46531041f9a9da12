"""What the development scripts did, as package options and commands, without a GPU:
``sweep --tile-config`` and ``--samples``, ``attnbench profile`` and ``attnbench tiles``."""
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import PEAKS, PROVENANCE, FakeTiledImpl, FakeTimer, host_inputs  # noqa: E402

from attnbench import sweep as sw  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.fwd_config import TileConfig, choose_config, parse_tile_config
from attnbench.fast_tc import IMPL, SYNC_IMPL  # noqa: E402
from attnbench.patterns import BadInput, make_mask  # noqa: E402
from attnbench.timing import MAX_SAMPLES, time_interleaved  # noqa: E402

from test_trust import one_error, rows  # noqa: E402


# -- --tile-config: parsing ------------------------------------------------------------------------

@pytest.mark.parametrize("text, given", [
    ("BN=32,STAGES=3", (("BN", 32), ("STAGES", 3))),
    ("stages=3, bn=32", (("BN", 32), ("STAGES", 3))),  # any case and order; shown in field order
    ("NWARPS=4,BN=64,STAGES=2,MINB=4,QREG=0,WG=1,TMA=1",
     (("NWARPS", 4), ("BN", 64), ("STAGES", 2), ("MINB", 4), ("QREG", 0), ("WG", 1), ("TMA", 1))),
    ("4,64,2", (("NWARPS", 4), ("BN", 64), ("STAGES", 2), ("MT", 1), ("MINB", 1), ("QREG", 1), ("WG", 0),
                ("TMA", 0))),  # positional: a whole shape, TileConfig's defaults after the numbers given (OV at 0 unnamed)
    ("4,32,3,1,2,0,1,1", (("NWARPS", 4), ("BN", 32), ("STAGES", 3), ("MT", 1), ("MINB", 2), ("QREG", 0),
                          ("WG", 1), ("TMA", 1))),
    ("OV=1,STAGES=3", (("STAGES", 3), ("OV", 1))),
    ("4,64,3,1,1,0,1,1,1", (("NWARPS", 4), ("BN", 64), ("STAGES", 3), ("MT", 1), ("MINB", 1), ("QREG", 0),
                            ("WG", 1), ("TMA", 1), ("OV", 1))),
    ("4,64,3,1,1,0,1,1,1,1", (("NWARPS", 4), ("BN", 64), ("STAGES", 3), ("MT", 1), ("MINB", 1), ("QREG", 0),
                              ("WG", 1), ("TMA", 1), ("OV", 1), ("REL", 1))),
    ("REL=1,OV=1", (("OV", 1), ("REL", 1))),
    ("8,128,3,1,1,0,1,1,1,1,1", (("NWARPS", 8), ("BN", 128), ("STAGES", 3), ("MT", 1), ("MINB", 1), ("QREG", 0),
                                 ("WG", 1), ("TMA", 1), ("OV", 1), ("REL", 1), ("PP", 1))),
    ("8,128,3,1,1,0,1,1,1,1,0,1", (("NWARPS", 8), ("BN", 128), ("STAGES", 3), ("MT", 1), ("MINB", 1), ("QREG", 0),
                                   ("WG", 1), ("TMA", 1), ("OV", 1), ("REL", 1), ("KVS", 1))),
    ("KVS=1", (("KVS", 1),)),
])
def test_tile_config_parses_named_and_positional_forms(text, given):
    spec = parse_tile_config(text)
    assert spec.given == given
    assert str(spec) == ",".join(f"{k}={v}" for k, v in given)


@pytest.mark.parametrize("text, words", [
    ("BN=20", "BN=20 must be a multiple of 16 from 16 to 256"),
    ("BN=512", "BN=512 must be a multiple of 16 from 16 to 256"),
    ("STAGES=1", "STAGES=1 must be from 2 to 8"),
    ("NWARPS=0", "NWARPS=0 must be from 1 to 32"),
    ("WG=2", "WG=2 must be 0 or 1"),
    ("BM=64", "unknown field 'BM' (fields: NWARPS, BN, STAGES, MT, MINB, QREG, WG, TMA, OV, REL, PP, KVS)"),
    ("BN=x", "BN='x' is not an integer"),
    ("BN=32,BN=64", "BN given twice"),
    ("4,64", "the positional form takes 3 to 12 numbers"),
    ("4,64,2,1,1,1,0,0,0,0,0,0,9", "the positional form takes 3 to 12 numbers"),
    ("BN=32,3", "give every field as FIELD=N, or all of them by position"),
    ("", "expected FIELD=N"),
    ("4,64,2,2,1,0,1,0", "WG=1 needs MT=1"),  # a whole shape the kernel cannot build
    ("4,64,2,1,1,0,0,1", "TMA=1 needs WG=1"),
    ("4,64,2,1,1,0,1,1,1", "OV=1 needs WG=1, TMA=1 and STAGES >= 3"),
    ("4,64,3,1,1,0,0,0,1", "OV=1 needs WG=1, TMA=1 and STAGES >= 3"),
    ("OV=2", "OV=2 must be 0 or 1"),
    ("4,64,3,1,1,0,1,0,0,1", "REL=1 needs WG=1 and TMA=1"),
    ("REL=2", "REL=2 must be 0 or 1"),
    ("4,64,3,1,1,0,1,1,1,1,1", "PP=1 needs OV=1, REL=1 and NWARPS 8 to 16"),  # one warpgroup has no one to take turns with
    ("8,128,3,1,1,0,1,1,1,0,1", "PP=1 needs OV=1, REL=1"),
    ("8,128,2,1,1,0,1,1,0,1,1", "PP=1 needs OV=1"),  # the turns are the overlapped walk's
    ("PP=3", "PP=3 must be 0 or 1"),
    ("4,64,3,1,1,0,1,1,1,0,0,1", "KVS=1 needs OV=1 and REL=1"),
    ("KVS=2", "KVS=2 must be 0 or 1"),
])
def test_bad_tile_configs_name_the_option_and_the_limit(text, words):
    with pytest.raises(BadInput) as e:
        parse_tile_config(text)
    assert str(e.value).startswith(f"--tile-config {text!r}: ") and words in str(e.value)


def test_the_overlapped_walk_is_named_only_where_it_is_asked():
    """OV shows in a shape's spec (the setup_s column) only when set, so the rows of every other shape
    read as before; a strided pattern, which loads by cp.async, compiles the serial walk."""
    from attnbench.fwd_config import kernel_defines

    assert "OV" not in TileConfig(4, 64, 3, QREG=0, WG=1, TMA=1).spec
    ov = TileConfig(4, 64, 3, QREG=0, WG=1, TMA=1, OV=1)
    assert ov.spec.endswith(",TMA=1,OV=1") and ov.problem() is None
    assert kernel_defines(128, "bfloat16", make_mask("dense", 4096), ov)["OV"] == 1
    assert "OV" not in kernel_defines(128, "bfloat16", make_mask("dilated", 4096, window=64, dilation=2), ov)
    v = IMPL.tile_variant(parse_tile_config("OV=1,STAGES=3"))
    assert v.name == "fast-tc[STAGES=3,OV=1]"
    assert v.shape_for(make_mask("dense", 4096), 128, wgmma=True).OV == 1
    rel = TileConfig(4, 64, 3, QREG=0, WG=1, TMA=1, OV=1, REL=1)
    assert rel.spec.endswith(",OV=1,REL=1") and rel.smem_bytes(128) == ov.smem_bytes(128) + 8 * 3
    assert kernel_defines(128, "bfloat16", make_mask("dense", 4096), rel)["REL"] == 1
    assert "PP" not in kernel_defines(128, "bfloat16", make_mask("dense", 4096), rel)
    pp = TileConfig(8, 128, 3, QREG=0, WG=1, TMA=1, OV=1, REL=1, PP=1)
    assert pp.spec.endswith(",OV=1,REL=1,PP=1") and pp.problem() is None
    assert pp.smem_bytes(128) == replace(pp, PP=0).smem_bytes(128)  # the turns are named barriers, no memory
    assert kernel_defines(128, "bfloat16", make_mask("dense", 4096), pp)["PP"] == 1
    kvs = replace(pp, PP=0, KVS=1)  # K and V apart: two more barriers a stage
    assert kvs.spec.endswith(",OV=1,REL=1,KVS=1") and kvs.problem() is None
    assert kvs.smem_bytes(128) == pp.smem_bytes(128) + 16 * 3 and kvs.smem_bytes(128) <= 227 * 1024
    assert kernel_defines(128, "bfloat16", make_mask("dense", 4096), kvs)["KVS"] == 1


def test_a_shape_without_the_overlapped_walk_takes_the_serial_one_where_the_walk_cannot_be_built():
    """At D=128 fast-tc chooses OV=1 on sm_90 for rows of 512 keys or more (the wide role); a shape given with 2
    stages where OV is not named takes the serial walk instead of a shape that cannot be built, and a whole shape
    by position takes it unless it names OV; where OV is named it stays."""
    window = make_mask("window", 4096, True, window=1024)
    assert choose_config(window, 128, True).OV == 1
    assert IMPL.tile_variant(parse_tile_config("STAGES=2")).shape_for(window, 128, True).OV == 0
    assert IMPL.tile_variant(parse_tile_config("STAGES=4")).shape_for(window, 128, True).OV == 1
    for stages in (2, 3):  # a whole shape by position: OV and REL at TileConfig's defaults unless named
        whole = IMPL.tile_variant(parse_tile_config(f"4,64,{stages},1,1,0,1,1"))
        assert whole.shape_for(window, 128, True) == TileConfig(4, 64, stages, QREG=0, WG=1, TMA=1)
    assert IMPL.tile_variant(parse_tile_config("4,64,3,1,1,0,1,1,1")).shape_for(window, 128, True).OV == 1
    named = IMPL.tile_variant(parse_tile_config("STAGES=2,OV=1"))
    assert named.shape_for(window, 128, True).problem()  # refused before a launch (checked_shape)


def test_a_tile_variant_of_fast_tc_fixes_the_given_fields_of_the_shape_it_chooses():
    v = IMPL.tile_variant(parse_tile_config("BN=32,STAGES=3"))
    assert v.name == "fast-tc[BN=32,STAGES=3]" and v.family == IMPL.family and v.wgmma
    assert IMPL.name == "fast-tc" and IMPL.tile is None  # the registered one is untouched
    for wgmma in (False, True):
        for pattern in ("dense", "streaming", "dilated"):
            mask = make_mask(pattern, 4096, True)
            chosen = choose_config(mask, 64, wgmma)
            got = v.shape_for(mask, 64, wgmma)
            assert (got.BN, got.STAGES) == (32, 3)
            assert (got.NWARPS, got.MT, got.MINB, got.QREG, got.WG, got.TMA) == \
                (chosen.NWARPS, chosen.MT, chosen.MINB, chosen.QREG, chosen.WG, chosen.TMA)
    whole = SYNC_IMPL.tile_variant(parse_tile_config("4,64,2"))
    assert whole.name == "fast-tc-sync[NWARPS=4,BN=64,STAGES=2,MT=1,MINB=1,QREG=1,WG=0,TMA=0]"
    assert whole.shape_for(make_mask("window", 4096, True), 128, False) == TileConfig(4, 64, 2)


def test_tile_shape_problems():
    assert TileConfig(4, 64, 2, WG=1, TMA=1).problem() is None
    assert "BN 32, 64 or 128" in TileConfig(4, 48, 2, WG=1).problem()
    assert "whole warpgroups" in TileConfig(2, 64, 2, WG=1).problem()
    assert TileConfig(4, 64, 2, MINB=4, QREG=0).spec == "NWARPS=4,BN=64,STAGES=2,MT=1,MINB=4,QREG=0,WG=0,TMA=0"


# -- --samples: the timer ----------------------------------------------------------------------------

def test_a_fixed_sample_count_ignores_spread_and_budget():
    values = iter([1.0, 3.0] * 1000)
    out = time_interleaved({"a": lambda: None, "b": lambda: None}, lambda fn: next(values), samples=7,
                           budget_s=0.0, warmup=0)
    assert out["a"].samples == out["b"].samples == 7
    steady = time_interleaved({"a": lambda: None}, lambda fn: 2.0, samples=25, warmup=0)
    assert steady["a"].samples == 25  # settled long before, still 25
    for bad in (0, MAX_SAMPLES + 1):
        with pytest.raises(ValueError, match="samples="):
            time_interleaved({"a": lambda: None}, lambda fn: 1.0, samples=bad)


def test_context_passes_the_budget_or_the_sample_count():
    base = dict(time=None, peaks=PEAKS, provenance={})
    assert sw.Context(**base, budget_s=0.5).timing_options() == {"budget_s": 0.5}
    assert sw.Context(**base, budget_s=0.5, samples=9).timing_options() == {"samples": 9}


# -- the sweep command with the fakes ---------------------------------------------------------------

@pytest.fixture
def tiled(registry, monkeypatch):
    """The fakes, one that takes tile shapes among them; ``made["timer"]`` is the sweep's timer."""
    registry["fake-tiled"] = FakeTiledImpl()
    made = {}

    def context(seed, budget_s, command, progress, samples=None):
        made["timer"] = timer = FakeTimer(list(registry.values()))
        return sw.Context(time=timer, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                          cleanup=lambda: None, seed=seed, budget_s=budget_s, command=command,
                          progress=progress, samples=samples)
    monkeypatch.setattr(sw, "device_context", context)
    return made


SMALL = ["--T", "32", "--T", "64", "--pattern", "dense", "--D", "16"]


def test_each_tile_config_is_a_row_of_its_own_timed_with_the_others(tmp_path, tiled):
    out = tmp_path / "r.csv"
    r = CliRunner().invoke(main, ["sweep", *SMALL, "--impl", "fake-tiled", "--impl", "fake-exact",
                                  "--tile-config", "BN=32,STAGES=3", "--tile-config", "4,64,2",
                                  "--tile-config", "stages=3,bn=32", "--out", str(out)])
    assert r.exit_code == 0, r.output
    names = ["fake-tiled", "fake-tiled[BN=32,STAGES=3]",
             "fake-tiled[NWARPS=4,BN=64,STAGES=2,MT=1,MINB=1,QREG=1,WG=0,TMA=0]", "fake-exact"]
    got = rows(out)
    assert [(x["T"], x["impl"], x["status"]) for x in got] == [(T, n, "ok") for T in ("32", "64") for n in names]
    shapes = {x["impl"]: json.loads(x["setup_s"])["tile_config"] for x in got if x["impl"].startswith("fake-tiled")}
    assert shapes == {"fake-tiled": "NWARPS=4,BN=64,STAGES=2,MT=1,MINB=1,QREG=1,WG=0,TMA=0",
                      names[1]: "NWARPS=4,BN=32,STAGES=3,MT=1,MINB=1,QREG=1,WG=0,TMA=0",
                      names[2]: "NWARPS=4,BN=64,STAGES=2,MT=1,MINB=1,QREG=1,WG=0,TMA=0"}
    assert tiled["timer"].calls == [sorted(names)] * 2  # interleaved with the others, once per configuration
    assert {x["family"] for x in got} == {"attnbench"}


def test_samples_reach_the_timer_instead_of_the_budget(tmp_path, tiled):
    out = tmp_path / "r.csv"
    r = CliRunner().invoke(main, ["sweep", *SMALL, "--impl", "fake-exact", "--samples", "7", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert tiled["timer"].options == [{"samples": 7}] * 2
    assert {x["samples"] for x in rows(out)} == {"7"}
    r = CliRunner().invoke(main, ["sweep", *SMALL, "--impl", "fake-exact", "--out", str(tmp_path / "b.csv")])
    assert r.exit_code == 0, r.output
    assert tiled["timer"].options == [{"budget_s": 2.0}] * 2


@pytest.fixture
def no_device(registry, monkeypatch):
    def refuse(**kw):
        raise AssertionError("the device was touched")
    monkeypatch.setattr(sw, "device_context", refuse)
    registry["fake-tiled"] = FakeTiledImpl()


@pytest.mark.parametrize("args, words", [
    (["--impl", "fake-exact", "--tile-config", "BN=20"], ("--tile-config 'BN=20'", "multiple of 16 from 16 to 256")),
    (["--tile-config", "WG=1,MT=2,NWARPS=4,BN=64,STAGES=2,MINB=1,QREG=0,TMA=0"], ("--tile-config", "WG=1 needs MT=1")),
    (["--impl", "fake-exact", "--tile-config", "BN=32"], ("--tile-config", "none of the implementations (fake-exact)")),
    (["--samples", "0"], ("--samples=0", "from 1 to 1000")),
    (["--samples", "1001"], ("--samples=1001", "from 1 to 1000")),
    (["--samples", "5", "--time-budget", "1"], ("--samples", "--time-budget")),
])
def test_bad_sweep_options_are_refused_before_the_device(tmp_path, no_device, args, words):
    one_error(CliRunner().invoke(main, ["sweep", "--out", str(tmp_path / "r.csv"), *args]), *words)
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.gpu
def test_a_fast_tc_tile_variant_runs_its_shape_passes_the_gate_and_records_the_shape():
    from attnbench.arrays import random_inputs
    from attnbench.check import judge
    from attnbench.impls import Problem

    prob = Problem(make_mask("window", 1000, True, window=200), 1, 2, 64, "bfloat16")
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=5)
    for base in (IMPL, SYNC_IMPL):
        variant = base.tile_variant(parse_tile_config("BN=32,STAGES=3"))
        runner = variant.prepare(prob, q, k, v)
        assert (runner.cfg.BN, runner.cfg.STAGES) == (32, 3)
        assert runner.setup["tile_config"] == runner.cfg.spec
        assert base.prepare(prob, q, k, v).setup["tile_config"] == base.shape_for(prob.mask, 64).spec
        assert judge(variant, prob, runner, q, k, v).ok


# -- attnbench profile -------------------------------------------------------------------------------

class RecordingNvtx:
    """Stands in for cupy.cuda.nvtx: the ranges pushed and popped, with the runner's launch count."""

    def __init__(self, runner_calls):
        self.events, self.calls = [], runner_calls

    def RangePush(self, name):
        self.events.append(("push", name, self.calls()))

    def RangePop(self):
        self.events.append(("pop", self.calls()))


def test_profile_gates_warms_up_then_launches_once_inside_the_nvtx_range():
    from fakes import FakeImpl

    from attnbench.devtools import profile_launch
    from attnbench.impls import Problem

    impl = FakeTiledImpl()
    made = []
    prepare = impl.prepare
    impl.prepare = lambda *a: made.append(prepare(*a)) or made[-1]
    nvtx = RecordingNvtx(lambda: made[0].calls)
    prob = Problem(make_mask("window", 64, True, window=8), 1, 2, 16, "float32")
    res, setup = profile_launch(impl, prob, inputs=host_inputs, nvtx=nvtx, synchronize=lambda: None)
    assert res.ok and setup["tile_config"] == impl.base.spec
    # the gate's launch and the warm-up before the range, one launch inside it
    assert nvtx.events == [("push", "profile", 2), ("push", "fake-tiled", 2), ("pop", 3), ("pop", 3)]
    wrong = FakeImpl("fake-wrong", factor=1.5)
    nvtx.events.clear()
    res, _ = profile_launch(wrong, prob, inputs=host_inputs, nvtx=nvtx, synchronize=lambda: None)
    assert not res.ok and nvtx.events == []  # a failed gate is not profiled


def test_profile_of_a_backward_gates_its_gradients_before_the_range():
    from fakes import FakeImpl

    from attnbench.devtools import profile_launch
    from attnbench.impls import PASSES, Problem

    prob = Problem(make_mask("window", 64, True, window=8), 1, 2, 16, "float16", pass_name="bwd")
    good = FakeImpl("fake-bwd", passes=PASSES)
    nvtx = RecordingNvtx(lambda: 0)
    res, _ = profile_launch(good, prob, inputs=host_inputs, nvtx=nvtx, synchronize=lambda: None)
    assert res.ok and [e[:2] for e in nvtx.events] == [("push", "profile"), ("push", "fake-bwd"), ("pop", 0),
                                                       ("pop", 0)]
    bad = FakeImpl("fake-bad-dk", passes=PASSES, grad_scale={"dk": 1.5})  # its output right, dK wrong
    nvtx.events.clear()
    res, _ = profile_launch(bad, prob, inputs=host_inputs, nvtx=nvtx, synchronize=lambda: None)
    assert not res.ok and "dk" in res.reason and nvtx.events == []


def profile(*args):
    return CliRunner().invoke(main, ["profile", *map(str, args)])


@pytest.mark.parametrize("args, words", [
    (["--impl", "nope"], ("'--impl': 'nope' is not one of",)),
    (["--impl", "fake-exact", "--tile-config", "BN=20"], ("--tile-config 'BN=20'", "multiple of 16 from 16 to 256")),
    (["--impl", "fake-exact", "--tile-config", "BN=32"], ("--tile-config", "impl=fake-exact takes no tile shape")),
    (["--impl", "fake-exact", "--D", "0"], ("D=0 must be a positive integer",)),
    (["--impl", "fake-exact", "--T", "0"], ("T=0 must be a positive integer",)),
    (["--impl", "fake-exact", "--pattern", "window", "--window", "0"], ("window",)),
    (["--impl", "fake-f16"], ("dtype=bfloat16 is not supported by fake-f16",)),
    (["--impl", "fake-absent", "--dtype", "float16"], ("impl=fake-absent cannot run here",)),
    (["--impl", "fake-exact", "--decode-config", "SPLITS=2"], ("--decode-config", "impl=fake-exact takes no decode shape")),
    (["--impl", "fake-exact", "--decode-config", "BY_KEYS=5"], ("--decode-config 'BY_KEYS=5'", "from 0 to 2")),
    (["--impl", "fake-exact", "--H", "8", "--H-kv", "3"], ("H_kv=3", "dividing H=8")),
    (["--impl", "fake-exact", "--T", "64", "--Tq", "65"], ("Tq=65",)),
    (["--impl", "fake-exact", "--pass", "bwd", "--bwd-config", "DQ=1"], ("--bwd-config", "impl=fake-exact takes no backward shape")),
    (["--impl", "fake-exact", "--pass", "bwd", "--bwd-config", "PAIRS=3"], ("--bwd-config 'PAIRS=3'", "from 0 to 2")),
    (["--impl", "fake-exact", "--bwd-config", "DQ=1"], ("--bwd-config", "need --pass bwd or fwd+bwd")),
    (["--impl", "fake-exact", "--pass", "sideways"], ("'--pass': 'sideways' is not one of",)),
])
def test_profile_refuses_bad_input_before_any_launch(registry, monkeypatch, args, words):
    from attnbench import devtools

    monkeypatch.setattr(devtools, "_device_inputs", lambda *a: pytest.fail("inputs were made"))
    one_error(profile(*args), *words)


def test_profile_without_nvtx_says_so(registry, monkeypatch):
    from types import SimpleNamespace

    from attnbench import devtools

    monkeypatch.setattr(devtools, "_device_inputs", lambda *a: pytest.fail("inputs were made"))
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvtx", SimpleNamespace(available=False))
    monkeypatch.setattr(sys.modules["cupy.cuda"], "nvtx", sys.modules["cupy.cuda.nvtx"], raising=False)
    one_error(profile("--impl", "fake-exact", "--dtype", "float32"), "cupy.cuda.nvtx is not available")


def test_profile_on_a_machine_without_a_device_is_refused():
    from attnbench.impls import device_problem

    if device_problem() is None:
        pytest.skip("a device is here")
    one_error(profile(), "impl=fast-tc cannot run here")


# -- attnbench tiles ----------------------------------------------------------------------------------

def tiles(*args):
    return CliRunner().invoke(main, ["tiles", *map(str, args)])


def test_tiles_prints_host_build_times_and_writes_the_csv(tmp_path, monkeypatch):
    import pandas as pd

    from attnbench import impls as impls_mod
    from attnbench.configs import LLM

    monkeypatch.setattr(impls_mod, "device_problem", lambda: "no CUDA device (test)")
    out = tmp_path / "sub" / "tiles.csv"
    r = tiles("--T", 4096, "--repeat", 2, "--out", out)
    assert r.exit_code == 0, r.output
    assert "host builds only (no CUDA device (test))" in r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["pattern", "D", "BMxBN"] and "dev med" not in lines[0]
    assert len(lines) == 1 + 2 * len(LLM.instances)  # every instance at D 64 and 128
    df = pd.read_csv(out)
    assert len(df) == 2 * len(LLM.instances) and sorted(set(df["D"])) == [64, 128]
    assert (df["T"] == 4096).all() and (df["host_min_ms"] > 0).all() and (df["entries"] > 0).all()
    assert (df["host_min_ms"] <= df["host_median_ms"]).all()
    assert "device_median_ms" not in df.columns
    dense = df[(df["pattern"] == "dense") & (df["D"] == 64)].iloc[0]
    cfg = choose_config(make_mask("dense", 4096, True), 64, False)  # mma.sync shapes without a device
    assert (dense["BM"], dense["BN"], dense["tile_config"]) == (cfg.BM, cfg.BN, cfg.spec)
    wg = tiles("--T", 4096, "--repeat", 1, "--D", 128, "--wgmma", "--no-device")
    assert wg.exit_code == 0, wg.output
    want = choose_config(make_mask("dense", 4096, True), 128, True)
    assert f"{want.BM}x{want.BN}" in wg.stdout.splitlines()[1]


def test_tiles_skips_an_instance_that_does_not_fit():
    r = tiles("--T", 64, "--D", 64, "--repeat", 1, "--no-device")
    assert r.exit_code == 0, r.output
    assert "block_diagonal(block=128)" in r.stdout and "skipped: T=64 is not a multiple of block=128" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--T", "0"], ("--T=0 must be from 1 to 536870911",)),
    (["--T", str(2 ** 29)], ("--T=536870912 must be from 1 to 536870911",)),
    (["--repeat", "0"], ("--repeat=0 must be a positive integer",)),
    (["--D", "96"], ("--D=96", "D in 64, 128")),
    (["--config", "seed"], ("the seed config's D=384", "D in 64, 128")),
    (["--config", "huge"], ("'--config': 'huge' is not one of",)),
])
def test_tiles_refuses_bad_input_before_any_build(monkeypatch, args, words):
    from attnbench import tiles as tiles_mod

    monkeypatch.setattr(tiles_mod, "build", lambda *a: pytest.fail("built"))
    r = tiles(*args)
    one_error(r, *words)
    assert r.stdout == ""


def test_tiles_refuses_an_unwritable_out_before_any_build(tmp_path, monkeypatch):
    from attnbench import tiles as tiles_mod

    monkeypatch.setattr(tiles_mod, "build", lambda *a: pytest.fail("built"))
    (tmp_path / "f").write_text("x")
    one_error(tiles("--no-device", "--out", tmp_path / "f" / "t.csv"), "--out", "is not a directory")


# -- attnbench floor --------------------------------------------------------------------------------

def test_floor_refuses_bad_input_and_a_machine_without_a_device():
    r = CliRunner().invoke(main, ["floor", "--samples", "0"])
    one_error(r, "--samples=0 must be from 1 to")
    from attnbench.impls import device_problem

    if device_problem() is None:
        pytest.skip("a device is here")
    one_error(CliRunner().invoke(main, ["floor"]), "floor needs a GPU")


@pytest.mark.gpu
def test_floor_rows_say_what_the_protocol_measures_for_next_to_nothing(tmp_path):
    import pandas as pd

    out = tmp_path / "floor.csv"
    r = CliRunner().invoke(main, ["floor", "--samples", "15", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = pd.read_csv(out).set_index("what")
    assert len(rows) == 14 and rows["gpu"].notna().all() and rows["git_commit"].notna().all()
    assert (rows["median_ms"] > 0).all() and (rows["samples"] == 15).all()
    # a second launch and a bigger read each cost something on top
    assert rows.loc["two empty launches", "median_ms"] > rows.loc["one empty launch", "median_ms"]
    for tail in ("", ", L2 evict-first"):
        reads = rows.loc[[f"read {n} MiB{tail}" for n in (4, 32, 128, 1024)], "median_ms"]
        assert reads.is_monotonic_increasing and reads.is_unique


def test_the_evict_first_read_differs_from_the_plain_one_by_its_l2_policy_alone():
    """kernels/bandwidth.cu's two reads: the same loop, read_sum_evict_first's loads with createpolicy's evict-first
    L2 policy, read_sum's plain."""
    import re

    from attnbench import compile as kc

    text = kc.ptx("bandwidth", {}, "sm_80")
    bodies = dict(re.findall(r"\.entry (read_sum\w*)\((.*?)\n}", text, re.S))
    assert set(bodies) == {"read_sum", "read_sum_evict_first"}
    assert "cache_hint" not in bodies["read_sum"] and "createpolicy" not in bodies["read_sum"]
    hinted = bodies["read_sum_evict_first"]
    assert "createpolicy.fractional.L2::evict_first" in hinted
    loads = [ln for ln in hinted.splitlines() if "ld.global" in ln]
    assert loads and all("ld.global.nc.L2::cache_hint.v4.f32" in ln for ln in loads)
    assert all("ld.global.nc.v4.f32" in ln for ln in bodies["read_sum"].splitlines() if "ld.global" in ln)


def test_floor_refuses_an_unwritable_out_before_any_device(tmp_path):
    (tmp_path / "a-file").write_text("")
    one_error(CliRunner().invoke(main, ["floor", "--out", str(tmp_path / "a-file" / "x.csv")]), "--out")


@pytest.mark.parametrize("command", ["profile", "sweep"])
def test_every_decode_shape_field_is_in_the_help(command):
    from attnbench.decode_config import DECODE_FIELDS

    text = " ".join(CliRunner().invoke(main, [command, "--help"], terminal_width=200).output.split())
    assert all(f in text for f in DECODE_FIELDS), [f for f in DECODE_FIELDS if f not in text]


# -- scripts/gpu_check.sh and the probes it runs ----------------------------------------------------------------------

GPU_CHECK = Path(__file__).parents[1] / "scripts" / "gpu_check.sh"


def _gpu_check_steps() -> list[str]:
    import re

    text = GPU_CHECK.read_text()
    body = text[text.index('case "$s" in'):]
    return re.findall(r"^    ([a-z]+)\)", body, re.M)


def test_every_gpu_check_step_is_described_in_its_header():
    text = GPU_CHECK.read_text()
    header = text[:text.index("\nset ")]
    listed = next(line for line in header.splitlines() if line.startswith("#   steps:")).split()
    steps = _gpu_check_steps()
    assert {"tests", "context", "history", "placement", "decode"} <= set(steps)
    assert [s for s in steps if f"#   {s}:" not in header and s not in listed] == []


def test_the_history_step_s_default_variants_are_the_probe_s_choices():
    import re

    from scriptmod import script

    probe = script("history_probe")
    default = re.search(r"HISTORY_VARIANTS:-([^}]*)}", GPU_CHECK.read_text()).group(1).split()
    assert default and all(v.count(":") == 1 for v in default)
    for v in default:
        before, then = v.split(":")
        assert before in probe.BEFORE and then in probe.THEN


@pytest.mark.parametrize("name, needed", [("history_probe", ["--before", "gate", "--then", "sweep"]),
                                          ("placement_probe", [])])
def test_the_probes_refuse_bad_options_with_exit_2(name, needed, capsys):
    from scriptmod import script

    probe = script(name)
    with pytest.raises(SystemExit) as e:
        probe.main(needed + ["--out", "x.csv", "--no-such-option"])
    assert e.value.code == 2 and "--no-such-option" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        probe.main(["--help"])
    assert e.value.code == 0


def test_the_ab_step_runs_the_earlier_tree_s_package(tmp_path):
    """The ab step's ab_old, run from this repository's root (where gpu_check.sh runs), imports the package of the
    earlier tree AB_OLD names, not this tree's (python -m puts the working directory ahead of PYTHONPATH)."""
    import re
    import subprocess

    fn = re.search(r"^ *(ab_old\(\) \{.*\})$", GPU_CHECK.read_text(), re.M).group(1)
    old = tmp_path / "old"
    (old / "attnbench").mkdir(parents=True)
    (old / "attnbench" / "__init__.py").write_text("")
    repo = GPU_CHECK.parents[1]
    script = f'old="{old}"\n{fn}\nab_old -c "import attnbench, os; print(os.path.realpath(attnbench.__file__))"'
    out = subprocess.run(["bash", "-c", script], cwd=repo, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str((old / "attnbench" / "__init__.py").resolve())


def test_provenance_names_the_tree_the_files_are(tmp_path):
    """scripts/provenance.sh (gpu_check's commit): a given commit stands as given, except where it is the copy's own
    git HEAD while the tracked files differ from it (a copy whose .git is older than its files, the commit read from
    that .git): then it says -dirty. Without a given commit: git's, -dirty when modified; without git, .provenance."""
    import subprocess

    script = GPU_CHECK.parent / "provenance.sh"
    env = {k: v for k, v in os.environ.items() if k != "ATTNBENCH_GIT_COMMIT"}
    env.update(GIT_AUTHOR_NAME="a", GIT_AUTHOR_EMAIL="a@b", GIT_COMMITTER_NAME="a", GIT_COMMITTER_EMAIL="a@b")

    def label(given=None):
        e = dict(env, ATTNBENCH_GIT_COMMIT=given) if given else env
        return subprocess.run(["bash", str(script)], cwd=tmp_path, env=e, capture_output=True, text=True,
                              check=True).stdout.strip()

    (tmp_path / ".provenance").write_text("abc1234\n")
    assert label() == "abc1234"  # no git metadata
    assert label("feed123") == "feed123"
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run(git + ["init", "-q"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "k.cu").write_text("old\n")
    subprocess.run(["git", "add", "k.cu"], cwd=tmp_path, check=True, env=env)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=tmp_path, check=True, env=env)
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert label().startswith(head) and not label().endswith("-dirty")
    assert label(head) == head  # the files are that commit
    (tmp_path / "k.cu").write_text("new\n")  # the files moved on; the metadata did not
    assert label().endswith("-dirty")
    assert label(head) == head + "-dirty"
    assert label(head + "-dirty") == head + "-dirty"
    assert label("feed123") == "feed123"  # another commit given: the files are that one, as the caller says
