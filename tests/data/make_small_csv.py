"""Build tests/data/small.csv and tests/data/train.csv: TEST DATA from fake implementations, not a
measurement.

Every row has gpu = "test-fixture"; the times come from tests/data/fakes.py's made-up
formula. Run from the repository root:  PYTHONPATH=. python tests/data/make_small_csv.py [small] [train]
(both when neither is named). train.csv holds fwd, bwd and fwd+bwd rows (the training
configuration's passes), with an implementation that computes the forward only.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fakes import PEAKS, PROVENANCE, FakeImpl, FakeTimer, fake_impls, host_inputs  # noqa: E402

from attnbench.results import ResultWriter  # noqa: E402
from attnbench.sweep import Context, plan, run_sweep  # noqa: E402

COMMAND = "python tests/data/make_small_csv.py"


def small_cases():
    """Two (dtype, D) groups; T 32..128; one block size (64) that does not fit T=32."""
    common = dict(patterns=("dense", "window", "streaming", "block_diagonal"), T_min=32, T_max=128, B=1, H=2,
                  window=(16,), sink=(4,), block=(16, 64))
    return plan("seed", D=(16,), dtype=("float32",), **common) + plan("seed", D=(32,), dtype=("float16",), **common)


def train_cases():
    """The three passes of one (dtype, D) group; T 32 and 64; dense, a window and block-diagonal."""
    return plan("training", patterns=("dense", "window", "block_diagonal"), T=(32, 64), B=1, H=2, D=(16,),
                dtype=("float32",), window=(16,), block=(16,))


def train_impls():
    by = {i.name: i for i in fake_impls()}
    return [by["fake-exact"], by["fake-slow"], by["fake-peer"], FakeImpl("fake-fwd-only", speed=2.0)]


def build(path, cases=small_cases, impls=fake_impls) -> dict:
    impls = impls()
    ctx = Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                  cleanup=lambda: None, command=COMMAND)
    with ResultWriter(path, overwrite=True) as w:
        return run_sweep(cases(), impls, w, ctx)


if __name__ == "__main__":
    which = sys.argv[1:] or ["small", "train"]
    if "small" in which:
        print(build(HERE / "small.csv"))
    if "train" in which:
        print(build(HERE / "train.csv", train_cases, train_impls))
