"""compute-sanitizer memcheck and racecheck over every kernel family (GPU machines with the tool), the\ntensor-core backward included."""
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("impl,D", [("naive", 64), ("fast-f32", 64), ("fast-tc", 64), ("fast-tc", 128),
                                    ("fast-tc-sync", 64), ("fast-tc-sync", 128)])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_kernels_are_sanitizer_clean(impl, D, tool):
    """Every pattern through the gate at an odd and a tile-sized T, under compute-sanitizer (the tensor-core
    families at both head dimensions: their shapes differ by D)."""
    _check_is_clean(tool, ["--impl", impl, "--T", "7", "--T", "64", "--D", str(D), "--B", "1", "--H", "2"], 240)


def _check_is_clean(tool: str, options: list, timeout: int, program: list | None = None) -> None:
    """``attnbench check`` with ``options`` (or ``program``, Python's arguments, which prints check's summary
    line) under compute-sanitizer's ``tool``: no error or hazard, and every case it checked passed, none
    skipped."""
    program = program or ["-m", "attnbench.cli", "check", *options]
    cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "17", sys.executable, *program]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-2000:]
    m = re.search(r"checked (\d+), passed (\d+), failed 0, skipped 0", out)
    assert m and m.group(1) == m.group(2) != "0", out[-2000:]


# fast-tc's overlapped walk (--tile-config OV=1, which `attnbench check` does not take): the gate in a script
OVERLAP_GATE = """
from attnbench.check import gate
from attnbench.fwd_config import parse_tile_config
from attnbench.fast_tc import IMPL
from attnbench.impls import Problem
from attnbench.patterns import make_mask
from attnbench.fwd_config import HOPPER_LONG_CONFIGS
long = {D: HOPPER_LONG_CONFIGS[D] for D in (64, 128)}
shapes = [("OV=1,STAGES=3", D) for D in (64, 128)] + [(c.spec if c.OV else f"{c.spec},OV=0", D) for D, c in long.items()]
shapes += [("OV=1,STAGES=3,REL=1", D) for D in (64, 128)] + [("NWARPS=8,BN=128,STAGES=3,MINB=1,OV=1,REL=1,PP=1", D)
                                                              for D in (64, 128)]
shapes += [("NWARPS=12,BN=64,STAGES=3,MINB=1,OV=1,REL=1,PP=1", 128)]
shapes += [(s, D) for s in ("OV=0,REL=1", "NWARPS=8,BN=128,STAGES=2,MINB=1,OV=0,REL=1") for D in (64, 128)]
shapes += [(s, D) for s in ("OV=1,STAGES=3,REL=1,KVS=1", "NWARPS=8,BN=128,STAGES=3,MINB=1,OV=1,REL=1,KVS=1")
           for D in (64, 128)]
cases = [("dense", {}, 100), ("window", {"window": 70}, 300), ("block_diagonal", {"block": 16}, 64)]
res = [gate(IMPL.tile_variant(parse_tile_config(s)), Problem(make_mask(p, T, p != "block_diagonal", **kw), 1, 2, D,
                                                             "bfloat16"))
       for s, D in shapes for p, kw, T in cases]
ok = sum(r.ok for r in res)
print(f"checked {len(res)}, passed {ok}, failed {len(res) - ok}, skipped 0")
"""


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_the_overlapped_walk_is_sanitizer_clean(tool):
    """The forward with S of a tile in flight beside P V of the one before (kernels/tc/loop_overlap.cuh):
    stages refilled one tile later, several tiles a list, one tile a list (block-diagonal 16), D 64 and 128;
    and the long lists' shapes (two warpgroups sharing 128-key tiles) on the same cases; and the stages released
    by the warps' arrivals (REL=1, kernels/tc/load_released.cuh), one warpgroup and two, and two and three
    warpgroups in turn (PP=1, kernels/tc/turns.cuh), REL on the serial walk, one warpgroup and two, and K and V on
    stages of their own (KVS=1, kernels/tc/load_split.cuh)."""
    _check_is_clean(tool, [], 400, program=["-c", OVERLAP_GATE])


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("pass_name", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
@pytest.mark.parametrize("shapes", [["--T", "64", "--T", "100", "--D", "64"], ["--T", "512", "--D", "64"],
                                    ["--T", "512", "--D", "128"]], ids=["copies", "in_place_d64", "in_place_d128"])
def test_fast_tc_classes_is_sanitizer_clean(tool, pass_name, shapes):
    """fast-tc-classes (fast-tc's kernels on the bands) through the gate: dilated with three levels; T 64 and 100
    (the copies into and out of the class-major layout; a class of 25 positions: words across classes), D=64; T=512
    (128 positions a class: the layout read in place, kernels/tc/rows.cuh), D 64 and 128."""
    _check_is_clean(tool, ["--impl", "fast-tc-classes", "--pattern", "dilated", "--window", "8", "--dilation", "1",
                           "--levels", "6:2,4:4", *shapes, "--B", "1", "--H", "2", "--pass", pass_name], 400)


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("tq, shape", [(1, ""), (16, ""), (16, "CLUSTER=0"), (1, "BY_PAIRS=1"), (16, "HEADS=4"),
                                       (16, "HEADS=2,CLUSTER=0"), (16, "WG=0"), (16, "NWARPS=8,KWG=2"),
                                       (16, "NWARPS=8,KWG=2,CLUSTER=0"), (16, "CMERGE=1")])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_fast_decode_is_sanitizer_clean(tool, tq, shape):
    """fast-decode on every pattern through the gate, grouped heads (8 over 2), one query and sixteen: the
    short lists' 32-key tiles (T 77 and 1000), the 64-key tiles and the key-slice kernel of a long list
    (dense and window at T=4096, Tq=1), the splits of a pair merging in their thread-block cluster (sm_90:
    4 rows a pair at Tq=1, 64 at Tq=16), the merge launch (CLUSTER=0, and before sm_90), a dilated
    query's residue class, a warp a pair (BY_PAIRS=1: kernels/decode_pairs.cu on the short lists, two
    warps of four idle), and a group's heads dealt to blocks of their own (the kernels' HSPLIT: by default on the
    short lists at Tq=16, whose 4 pairs are few; HEADS=4 on every list, HEADS=2 with the merge launch). On sm_90
    the rows kernel (Tq=16's 64 rows) runs on warpgroup MMA by default, and on mma.sync with WG=0; KWG=2 puts two
    warpgroups on those rows, each on half of every tile (sm_90 only), with the cluster's merge and the launch's;
    CMERGE=1 gathers each thread's reads of the cluster's partials before it uses any."""
    env = dict(os.environ, ATTNBENCH_DECODE_CONFIG=shape) if shape else dict(os.environ)
    _decode_is_clean(tool, ["--T", "77", "--T", "1000", "--T", "4096", "--Tq", str(tq), "--D", "64", "--B", "2",
                            "--H", "8", "--H-kv", "2"], env)


def _decode_is_clean(tool: str, options: list, env: dict | None = None) -> None:
    """``attnbench check --impl fast-decode`` with ``options`` under compute-sanitizer's ``tool``: no error or
    hazard, none failed and some passed."""
    # CuPy's own kernels left out: the tile classification's flatnonzero (classify.py) runs CuPy's scan, whose
    # racecheck warnings are its own
    cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "17", "--kernel-name-exclude", "kns=cupy_",
           sys.executable, "-m", "attnbench.cli", "check", "--impl", "fast-decode", *options]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env or dict(os.environ))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-2000:]
    m = re.search(r"checked (\d+), passed (\d+), failed 0", out)
    assert m and int(m.group(2)) > 0, out[-2000:]


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_fast_decode_ragged_batch_is_sanitizer_clean(tool):
    """fast-decode through the gate on a ragged batch of pairs enough for one wave (8 sequences x 8 key/value heads,
    one query each): dense's lists walked flat (FLAT=1: a block's run of stretches crossing pairs, the merge launch
    weighing each pair's slots; racecheck: the block barrier before a stretch reuses the last one's shared memory) and
    window 3000's short ones split on their own and merged in a cluster."""
    _decode_is_clean(tool, ["--pattern", "dense", "--pattern", "window", "--window", "3000", "--T", "16384", "--Tq",
                            "1", "--D", "64", "--B", "8", "--H", "32", "--H-kv", "8", "--cache-lens",
                            "16384,4096,1024,2048,8192,64,3008,1000"])


# fast-tc's backward (fwd+bwd: the forward with the log-sum-exp, prep, main, dQ conversion) on small
# cases: odd T, a partial last tile, non-causal keys past T, a strided pattern, both head dims; and
# once more with the lists cut into items of one query tile (split key tiles: their float32 dK and
# dV rows zeroed by prep, summed by the main kernel, converted after dQ), so with dQ's own pass, and
# with two warpgroups on 128-key tiles at both head dims; dQ's way forced each way (the default takes the
# pass for the short lists here), with two warpgroups too (on sm_90 the wgmma main loop without dQ); and
# two warpgroups at D=64 with their dQ products in flight a tile longer (PAIRS=2; dense T=600 walks lists
# of up to 10 query tiles, so several pairs a list); on sm_90 the pass on wgmma by default, the mma.sync
# build's beside the wgmma main loop (PWG=0), and the wgmma pass's tiles by cp.async (PTMA=0; by bulk tensor
# copies by default); the wgmma main loop's Q and dO by cp.async (MTMA=0; by bulk tensor copies by default), beside
# the pass and with two warpgroups and dQ's reductions; the wgmma pass and the wgmma main loop persistent (PPER=1,
# MPER=1, the latter by cp.async too; by three blocks, so that each takes several works); dQ's sums by bulk tensor
# reductions from shared memory (DQR=1), one warpgroup and two, and from two sets of staging buffers (DQR=2); and dQ stored by the wgmma main loop on
# block-diagonal patterns (one warpgroup, two, split key tiles, by cp.async, persistent); and the two warpgroups a
# tile apart (LAG=1), dQ by each way, lists whole and cut into one-tile items
BACKWARD_RUNS = """
import os
import cupy
from attnbench.arrays import random_inputs
from attnbench.bwd_config import DQ_ENV, PERSIST_BLOCKS_ENV, SHAPE_ENV, SPLIT_ENV, parse_bwd_config
from attnbench.impls import Problem, get_impl
from attnbench.patterns import make_mask
n = 0
for impl, split, dq, shape, fields in (
        ("fast-tc", "", "", "", ""), ("fast-tc-sync", "", "", "", ""), ("fast-tc", "1", "", "", ""),
        ("fast-tc", "1", "pass", "", ""), ("fast-tc", "", "", "NWARPS=8,MINB=1", ""),
        ("fast-tc", "", "atomic", "", ""), ("fast-tc", "", "pass", "NWARPS=8,MINB=1", ""),
        ("fast-tc", "", "atomic", "NWARPS=8,MINB=1,PAIRS=2", ""),
        ("fast-tc", "1", "atomic", "NWARPS=8,MINB=1,PAIRS=2", ""),
        ("fast-tc", "", "fused", "", ""), ("fast-tc", "1", "fused", "", ""),
        ("fast-tc", "", "pass", "", "PWG=0"), ("fast-tc", "1", "pass", "", "PTMA=0"),
        ("fast-tc", "1", "pass", "", "MTMA=0"), ("fast-tc", "1", "atomic", "NWARPS=8,MINB=1,PAIRS=1", "MTMA=0"),
        ("fast-tc", "1", "pass", "", "PPER=1"), ("fast-tc", "1", "pass", "", "MPER=1"),
        ("fast-tc", "1", "atomic", "NWARPS=8,MINB=1,PAIRS=2", "MPER=1"), ("fast-tc", "1", "pass", "", "MPER=1,MTMA=0"),
        ("fast-tc", "1", "atomic", "", "DQR=1"), ("fast-tc", "1", "atomic", "NWARPS=8,MINB=1", "DQR=1"),
        ("fast-tc", "1", "atomic", "NWARPS=8,MINB=1,PAIRS=0", "DQR=2")):
    os.environ[PERSIST_BLOCKS_ENV] = "3"  # a persistent launch's blocks
    os.environ[SPLIT_ENV] = split  # 1: every key tile visited twice or more split, its dK and dV summed
    os.environ[DQ_ENV] = dq  # pass: dQ by its own pass over the forward list; atomic: float32 reductions;
    #                          fused: that pass's blocks in the main loop's launch
    os.environ[SHAPE_ENV] = shape  # two warpgroups on 128-key tiles (D=128's own shape; at D=64 dQ in pairs,
    #                                with PAIRS=2 their products in flight a tile longer)
    for pattern, T, causal, params in (("dense", 100, True, {}), ("dense", 600, True, {}),
                                       ("streaming", 77, True, dict(sink=4, window=16)),
                                       ("window", 64, False, dict(window=8)),
                                       ("dilated", 77, False, dict(window=8, dilation=3)),
                                       ("dilated", 400, True, dict(window=70, dilation=3))):
        for D, dtype in ((64, "bfloat16"), (128, "float16")):
            prob = Problem(make_mask(pattern, T, causal, **params), 1, 2, D, dtype, pass_name="fwd+bwd")
            q, k, v = random_inputs(prob.shape, prob.dtype, seed=1)
            do = random_inputs(prob.shape, prob.dtype, seed=2)[0]
            im = get_impl(impl)
            if fields:  # the backward's fields of a --bwd-config variant
                im = im.bwd_variant(parse_bwd_config(fields))
            im.prepare(prob, q, k, v, do=do).run()
            cupy.cuda.get_current_stream().synchronize()
            n += 1
# dQ stored by the wgmma main loop (DQ=3; the default where every query tile reads one of one warpgroup's 64-key
# tiles): one warpgroup's tiles, two warpgroups' 128-key tiles, their key tiles split (dK and dV summed), by
# cp.async, persistent
os.environ[DQ_ENV] = ""
wgmma = get_impl("fast-tc").uses_wgmma()
STORE_RUNS = (("", "", "DQ=3"), ("1", "", "DQ=3"), ("", "", "DQ=3,MTMA=0"), ("", "", "DQ=3,MPER=1"))
for split, shape, fields in (STORE_RUNS if wgmma else ()):
    os.environ[SPLIT_ENV], os.environ[SHAPE_ENV] = split, shape
    for pattern, T, causal, params in (("block_diagonal", 192, False, dict(block=16)),
                                       ("block_diagonal", 384, False, dict(block=128))):
        for D, dtype in ((64, "bfloat16"), (128, "float16")):
            prob = Problem(make_mask(pattern, T, causal, **params), 1, 2, D, dtype, pass_name="fwd+bwd")
            q, k, v = random_inputs(prob.shape, prob.dtype, seed=1)
            do = random_inputs(prob.shape, prob.dtype, seed=2)[0]
            im = get_impl("fast-tc")
            r = im.bwd_variant(parse_bwd_config(fields)).prepare(prob, q, k, v, do=do)
            assert r.setup["bwd_dq"] == "store", r.setup["bwd_dq"]
            r.run()
            cupy.cuda.get_current_stream().synchronize()
            n += 1
# the wgmma main loop's two warpgroups a tile apart (LAG=1, kernels/tc/bwd_lag.cuh; unstrided patterns): dQ's panels
# as D's default (DQR=2 at D=128), by reductions from registers, by bulk reductions; lists cut into one-tile items too
os.environ[SHAPE_ENV] = ""
LAG_RUNS = (("", "LAG=1"), ("1", "LAG=1"), ("", "DQR=0,LAG=1"), ("", "DQR=1,LAG=1"))
for split, fields in (LAG_RUNS if wgmma else ()):
    os.environ[SPLIT_ENV] = split
    for pattern, T, causal, params in (("dense", 100, True, {}), ("dense", 600, True, {}),
                                       ("streaming", 77, True, dict(sink=4, window=16)),
                                       ("window", 64, False, dict(window=8))):
        for D, dtype in ((64, "bfloat16"), (128, "float16")):
            prob = Problem(make_mask(pattern, T, causal, **params), 1, 2, D, dtype, pass_name="fwd+bwd")
            q, k, v = random_inputs(prob.shape, prob.dtype, seed=1)
            do = random_inputs(prob.shape, prob.dtype, seed=2)[0]
            r = get_impl("fast-tc").bwd_variant(parse_bwd_config("NWARPS=8,MINB=1,DQ=0,PAIRS=0," + fields)).prepare(
                prob, q, k, v, do=do)
            assert r.setup["bwd_tile_config"].endswith(",LAG=1"), r.setup["bwd_tile_config"]
            r.run()
            cupy.cuda.get_current_stream().synchronize()
            n += 1
print(f"backward runs {n}" + ("" if wgmma else " (no wgmma)"))
"""


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_backward_kernels_are_sanitizer_clean(tool):
    cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "17", sys.executable, "-c", BACKWARD_RUNS]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=540, env=dict(os.environ))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-2000:]
    assert "backward runs 312" in out or "backward runs 264 (no wgmma)" in out, out[-2000:]
