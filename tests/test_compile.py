"""Every kernel compiles through NVRTC without a GPU, with the constants injected as -D options."""
import pytest

from attnbench import compile as kc


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_standard_build_compiles(arch):
    builds = kc.standard_builds()
    assert {name for name, _ in builds} >= {"naive"}
    for name, defines in builds:
        reports = kc.compile_only(name, defines, arch)
        assert reports, f"{name} {defines}: no kernel in the report"
        for r in reports:
            assert r.arch == arch and r.registers > 0
            assert r.spill_stores == 0 and r.spill_loads == 0, f"{r.kernel} spills with {defines}"


def test_constants_reach_the_compiler():
    # the dense kernel's score array is MAX_T floats of local memory
    small = {r.kernel: r for r in kc.compile_only("naive", {"MAX_T": 256, "MAX_KEYS": 1, "C": 64}, "sm_90")}
    large = {r.kernel: r for r in kc.compile_only("naive", {"MAX_T": 2048, "MAX_KEYS": 1, "C": 64}, "sm_90")}
    assert small["naive_dense"].stack == 256 * 4
    assert large["naive_dense"].stack == 2048 * 4


def test_missing_constant_is_a_compile_error():
    with pytest.raises(RuntimeError, match="MAX_T must be defined"):
        kc.compile_only("naive", {"MAX_KEYS": 1, "C": 64}, "sm_90")


def test_includes_are_expanded_into_the_source():
    src = kc.source("naive")
    assert '#include "common.cuh"' not in src and "ab_allowed" in src
