"""Build tests/data/small.csv: TEST DATA from fake implementations, not a measurement.

Every row has gpu = "test-fixture"; the times come from tests/data/fakes.py's made-up
formula. Run from the repository root:  PYTHONPATH=. python tests/data/make_small_csv.py
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fakes import PEAKS, PROVENANCE, FakeTimer, fake_impls, host_inputs  # noqa: E402

from attnbench.results import ResultWriter  # noqa: E402
from attnbench.sweep import Context, plan, run_sweep  # noqa: E402

COMMAND = "python tests/data/make_small_csv.py"


def small_cases():
    """Two (dtype, D) groups; T 32..128; one block size (64) that does not fit T=32."""
    common = dict(patterns=("dense", "window", "streaming", "block_diagonal"), T_min=32, T_max=128, B=1, H=2,
                  window=(16,), sink=(4,), block=(16, 64))
    return plan("seed", D=(16,), dtype=("float32",), **common) + plan("seed", D=(32,), dtype=("float16",), **common)


def build(path) -> dict:
    impls = fake_impls()
    ctx = Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                  cleanup=lambda: None, command=COMMAND)
    with ResultWriter(path, overwrite=True) as w:
        return run_sweep(small_cases(), impls, w, ctx)


if __name__ == "__main__":
    print(build(HERE / "small.csv"))
