"""Every kernel compiles through NVRTC without a GPU, with the constants injected as -D options."""
import re

import pytest

from attnbench import compile as kc
from attnbench.errors import BadInput
from attnbench.patterns import PATTERNS, make_mask


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_standard_build_compiles(arch):
    builds = kc.standard_builds()
    assert {name for name, _ in builds} >= {"naive"}
    targets = {kc.target_arch(d, arch) for _, d in builds}
    assert targets == ({"sm_80", None} if arch == "sm_80" else {"sm_90", "sm_90a"})  # wgmma builds: sm_90a
    for name, defines in builds:
        target = kc.target_arch(defines, arch)
        if target is None:
            continue
        reports = kc.compile_only(name, defines, target)
        assert reports, f"{name} {defines}: no kernel in the report"
        for r in reports:
            assert r.arch == target and r.registers > 0
            assert r.spill_stores == 0 and r.spill_loads == 0, f"{r.kernel} spills with {defines}"


DENSE = make_mask("dense", 64).device_defines(runtime=True)


def test_constants_reach_the_compiler():
    # the dense kernel's score array is MAX_T floats of local memory
    small = {r.kernel: r for r in kc.compile_only("naive", {"MAX_T": 256, "MAX_KEYS": 1, "C": 64, **DENSE}, "sm_90")}
    large = {r.kernel: r for r in kc.compile_only("naive", {"MAX_T": 2048, "MAX_KEYS": 1, "C": 64, **DENSE}, "sm_90")}
    assert small["naive_dense"].stack == 256 * 4
    assert large["naive_dense"].stack == 2048 * 4


def test_a_log_that_names_no_kernel_is_an_error_not_an_empty_report(monkeypatch):
    """A loop over compile_only's reports (every no-spill test, `attnbench compile`) checks nothing when there are
    none: a ptxas log that does not parse is refused instead."""
    monkeypatch.setattr(kc, "parse_ptxas", lambda log, name: [])
    with pytest.raises(RuntimeError, match="ptxas reported no kernel"):
        kc.compile_only("naive", {"MAX_T": 256, "MAX_KEYS": 1, "C": 64, **DENSE}, "sm_90")


def test_missing_constant_is_a_compile_error():
    with pytest.raises(RuntimeError, match="MAX_T must be defined"):
        kc.compile_only("naive", {"MAX_KEYS": 1, "C": 64, **DENSE}, "sm_90")


# a fast-tc shape whose warps and blocks per multiprocessor leave too few registers: 8 warps beside the short lists'
# MINB=4 (D=128, wgmma), 65536 / (8 x 32 x 4) = 64 a thread
_SHORT_OF_REGISTERS = dict(AB_F16=0, AB_PATTERN_ARGS="1,512", AB_PATTERN_T="ab_window", BN=64, CAUSAL=1, HEAD_D=128,
                           MINB=4, MT=1, NWARPS=8, QREG=0, STAGES=3, STRIDE=2, WG=1)


def test_a_shape_short_of_registers_is_refused_by_name(tmp_path, monkeypatch):
    """ptxas' failure for lack of registers becomes BadInput naming NWARPS, MINB and both counts (a sweep's
    `skipped` row, the CLI's exit 2), through compile_only and through the cubin cache get_module builds."""
    with pytest.raises(BadInput) as e:
        kc.compile_only("fast_tc", _SHORT_OF_REGISTERS, "sm_90a")
    msg = str(e.value)
    m = re.search(r"NWARPS=8 and MINB=4 .* leave 64 registers a thread, and this build needs at least (\d+)", msg)
    assert m and int(m.group(1)) > 64, msg
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(BadInput, match="NWARPS=8 and MINB=4"):
        kc._cached_cubin("fast_tc", kc.source("fast_tc", _SHORT_OF_REGISTERS), kc.options(_SHORT_OF_REGISTERS),
                         "sm_90a", _SHORT_OF_REGISTERS)
    assert not list(tmp_path.iterdir())  # nothing cached
    # 4 warps at MINB=4 leave 128: the same build compiles
    assert kc.compile_only("fast_tc", dict(_SHORT_OF_REGISTERS, NWARPS=4), "sm_90a")


def test_other_compile_failures_keep_the_log():
    assert kc.registers_refusal("x", {"NWARPS": 4, "MINB": 1}, "error: identifier \"y\" is undefined") is None
    refusal = kc.registers_refusal("x", {}, "ptxas fatal : (C7602) Insufficient registers (32) to compile "
                                            "instruction at line 9. Try to compile with register target of 40")
    assert "its launch bounds leave 32 registers a thread" in str(refusal) and "at least 40" in str(refusal)


def test_includes_are_expanded_into_the_source():
    src = kc.source("naive", DENSE)
    assert '#include "common.cuh"' not in src and "ab_allowed" in src
    assert not re.search(r"^\s*#\s*include", src, re.M) and "struct ab_dense" in src and "struct ab_window" not in src
    # fast_tc's parts sit in kernels/tc/ and include each other by paths relative to kernels/
    src = kc.source("fast_tc", make_mask("window", 64).device_defines())
    assert not re.search(r"^\s*#\s*include", src, re.M) and "struct TcTileList" in src and "struct TcSoftmax" in src
    assert src.count("struct TcTileList") == 1  # each header once


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_pattern_has_its_device_predicate(name):
    """The pattern's struct is compiled in by name: its header exists and compiles in every kernel
    that takes a pattern at run time."""
    defines = make_mask(name, 64, **PATTERNS[name].examples(64)[0]).device_defines(runtime=True)
    assert (kc.kernel_dir() / kc.pattern_header(defines)).is_file()
    assert [r.kernel for r in kc.compile_only("predicate", defines, "sm_80")] == ["predicate_bits"]


def test_a_kernel_without_its_pattern_is_refused():
    with pytest.raises(BadInput, match="AB_PATTERN_T"):
        kc.source("predicate", {})


def test_cubins_for_an_explicit_arch_are_built_once(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path))
    src, opts = kc.source("tiles"), kc.options({})
    path = kc._cached_cubin("tiles", src, opts, "sm_90a")
    assert path.parent == tmp_path and path.stat().st_size > 0
    stamp = path.stat().st_mtime_ns
    assert kc._cached_cubin("tiles", src, opts, "sm_90a") == path and path.stat().st_mtime_ns == stamp
    # other options, another file
    assert kc._cached_cubin("tiles", src, opts + ("-DX=1",), "sm_90a") != path
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".cubin", ".cubin"]


def test_wgmma_header_is_generated():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "gen_wgmma.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_resident_blocks_asks_the_driver_with_the_functions_handle(monkeypatch):
    """A RawModule's RawKernel carries its driver handle on ``.kernel`` (a cupy.cuda.Function, which
    has ``.ptr``): both are taken, the count asked of the driver with the threads and shared memory,
    and at least 1 returned."""
    import types

    pytest.importorskip("cupy_backends")
    from cupy_backends.cuda.api import driver

    from attnbench.compile import resident_blocks

    asked = []
    monkeypatch.setattr(driver, "occupancyMaxActiveBlocksPerMultiprocessor",
                        lambda ptr, threads, smem: asked.append((ptr, threads, smem)) or (3 if ptr == 7 else 0))
    func = types.SimpleNamespace(ptr=7)
    assert resident_blocks(types.SimpleNamespace(kernel=func), 128, 4096) == 3
    assert resident_blocks(func, 256, 0) == 3
    assert resident_blocks(types.SimpleNamespace(ptr=9), 128, 0) == 1  # never 0 blocks
    assert asked == [(7, 128, 4096), (7, 256, 0), (9, 128, 0)]
    with pytest.raises(AttributeError):
        resident_blocks(types.SimpleNamespace(), 128, 0)  # no handle: an error, not a silent 1


def test_the_overlapped_walk_keeps_its_products_in_flight():
    """ptxas serialises a wgmma whose accumulators a plain instruction touches while it is in flight (and says
    so, C7514 / C7515): the overlapped walk (kernels/tc/loop_overlap.cuh) must compile without it, or its S and
    P V would run one after the other again. The serial walk's builds say nothing either."""
    from attnbench.fast_tc import overlap_builds, standard_builds

    wg = [b for b in standard_builds() if b[0] == "fast_tc" and b[1].get("WG")]
    # every standard build on the overlapped walk (D=128's defaults, the forward with the log-sum-exp too), and
    # two on the serial one
    assert any(d.get("OV") and d.get("FWD_LSE") for _, d in wg)
    serial = [b for b in wg if not b[1].get("OV")][:2]
    released = [(n, {**d, "REL": 1}) for n, d in overlap_builds()[:1] + [b for b in wg if b[1].get("OV")][:2]]
    in_turn = [(n, {**d, "PP": 1}) for n, d in wg if d.get("REL")][:1]  # the long D=128 shape's warpgroups in turn
    apart = [(n, {**d, "KVS": 1}) for n, d in wg if d.get("REL")][:1] + [(n, {**d, "REL": 1, "KVS": 1})
                                                                         for n, d in overlap_builds()[:1]]
    assert in_turn and len(apart) == 2
    for name, defines in overlap_builds() + [b for b in wg if b[1].get("OV")] + serial + released + in_turn + apart:
        _, log = kc._nvrtc(name, kc.source(name, defines), list(kc.options(defines)) + ["-arch=sm_90a", "-Xptxas=-v"])
        assert "C7514" not in log and "C7515" not in log and "serialized" not in log, (defines, log)


def test_released_stages_take_the_block_barrier_out_of_the_walk():
    """REL=1 (kernels/tc/load_released.cuh): the warps release each stage by an mbarrier arrival, and the
    refill's block barrier is gone, so the build has fewer bar.sync than the same shape without it and
    arrives on the stage barriers."""
    from attnbench.fast_tc import overlap_builds

    name, defines = overlap_builds()[0]
    ptx = {rel: kc.ptx(name, {**defines, "REL": rel}, "sm_90a") for rel in (0, 1)}
    assert ptx[1].count("bar.sync") < ptx[0].count("bar.sync")
    assert "mbarrier.arrive.shared::cta.b64" in ptx[1] and "mbarrier.arrive.shared::cta.b64" not in ptx[0]


def test_released_stages_on_the_serial_walk_leave_no_block_barrier_a_tile():
    """REL=1 on the serial walk (kernels/tc/loop.cuh) of the long D=64 shape, two warpgroups: the refill's block
    barrier goes, and the lazy pass's vote, a block-wide reduction without REL, runs on each warpgroup's own named
    barrier (bar.red over 128 threads)."""
    from attnbench.fwd_config import HOPPER_LONG_CONFIGS, kernel_defines
    from attnbench.patterns import make_mask

    cfg = HOPPER_LONG_CONFIGS[64]
    assert cfg.OV == 0 and cfg.NWARPS == 8
    defines = kernel_defines(64, "bfloat16", make_mask("dense", 4096), cfg)
    ptx = {rel: kc.ptx("fast_tc", {**defines, "REL": rel}, "sm_90a") for rel in (0, 1)}
    assert ptx[1].count("bar.sync") < ptx[0].count("bar.sync")
    assert "mbarrier.arrive.shared::cta.b64" in ptx[1]
    assert ", 128, " in "".join(line for line in ptx[1].splitlines() if "bar.red.or.pred" in line)
    assert ", 128, " not in "".join(line for line in ptx[0].splitlines() if "bar.red.or.pred" in line)


def test_warpgroups_in_turn_wait_and_arrive_on_named_barriers():
    """PP=1 (kernels/tc/turns.cuh): each warpgroup waits for its turn on a named barrier of 256 threads (its own
    128 and the 128 arriving before it) and hands the turn on by arriving on the next one's; the build without
    it has neither."""
    from attnbench.fwd_config import HOPPER_LONG_CONFIGS, kernel_defines
    from attnbench.patterns import make_mask

    cfg = HOPPER_LONG_CONFIGS[128]
    assert cfg.REL == 1 and cfg.NWARPS == 8
    defines = kernel_defines(128, "bfloat16", make_mask("dense", 4096), cfg)
    ptx = {pp: kc.ptx("fast_tc", {**defines, "PP": 1} if pp else defines, "sm_90a") for pp in (0, 1)}
    assert "bar.arrive" not in ptx[0] and "bar.arrive" in ptx[1]
    assert ptx[1].count("bar.sync") > ptx[0].count("bar.sync")


def test_k_and_v_apart_wait_and_release_on_barriers_of_their_own():
    """KVS=1 (kernels/tc/load_split.cuh): K and V of a tile load on barriers of their own (a bulk copy each, where
    REL's build issues the pair on one), and each warp releases K's stage and V's apart: more copies and arrivals
    than REL's build of the long D=128 shape."""
    from attnbench.fwd_config import HOPPER_LONG_CONFIGS, kernel_defines
    from attnbench.patterns import make_mask

    defines = kernel_defines(128, "bfloat16", make_mask("dense", 4096), HOPPER_LONG_CONFIGS[128])
    assert defines.get("REL") == 1
    ptx = {kvs: kc.ptx("fast_tc", {**defines, "KVS": 1} if kvs else defines, "sm_90a") for kvs in (0, 1)}
    for op in ("mbarrier.arrive.shared::cta.b64", "mbarrier.arrive.expect_tx"):
        assert ptx[1].count(op) > ptx[0].count(op), op

