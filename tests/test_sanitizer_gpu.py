"""compute-sanitizer memcheck and racecheck over every kernel family (GPU machines with the tool)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("impl", ["naive", "fast-f32", "fast-tc", "fast-tc-sync"])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])
def test_kernels_are_sanitizer_clean(impl, tool):
    """Every pattern through the gate at an odd and a tile-sized T, under compute-sanitizer."""
    cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "17", sys.executable, "-m",
           "attnbench.cli", "check", "--impl", impl, "--T", "7", "--T", "64", "--D", "64", "--B", "1", "--H", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-2000:]
    m = re.search(r"checked (\d+), passed (\d+), failed 0, skipped 0", out)
    assert m and m.group(1) == m.group(2) != "0", out[-2000:]
