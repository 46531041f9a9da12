"""`attnbench sweep` with the test fakes standing in for the device, for tests that kill it.

    python tests/data/slow_sweep.py CUT DELAY SWEEP-OPTIONS...

CUT: after this many rows are written, write the first half of the next one, print "cut"
and hang, as a run killed in the middle of a row would leave it ("-": never). DELAY: seconds
each configuration takes. The exit status is the command's.
"""
from __future__ import annotations

import csv
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fakes import PEAKS, PROVENANCE, FakeTimer, fake_impls, host_inputs  # noqa: E402

from attnbench import impls as impls_mod  # noqa: E402
from attnbench import results  # noqa: E402
from attnbench import sweep as sw  # noqa: E402
from attnbench.cli import main  # noqa: E402


def fake_device(delay: float):
    impls = fake_impls()
    impls_mod._REGISTRY.clear()
    impls_mod._REGISTRY.update({i.name: i for i in impls})
    impls_mod._load_all = lambda: None
    timer = FakeTimer(impls)

    def slow_timer(runs, **options):
        time.sleep(delay)
        return timer(runs, **options)

    def context(seed, budget_s, command, progress, samples=None):
        return sw.Context(time=slow_timer, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                          cleanup=lambda: None, seed=seed, budget_s=budget_s, command=command,
                          progress=progress, samples=samples)
    sw.device_context = context


def cut_after(n: int):
    """Write ``n`` rows whole, then half a row, and hang."""
    write = results.ResultWriter.write
    count = [0]

    def cutting(self, rows):
        todo = [r for r in rows if not self.is_done(r)]
        if count[0] + len(todo) <= n:
            count[0] += len(todo)
            return write(self, todo)
        whole = n - count[0]
        write(self, todo[:whole])
        buf = io.StringIO()
        csv.DictWriter(buf, fieldnames=results.COLUMNS).writerow(
            {c: results._cell(todo[whole].get(c)) for c in results.COLUMNS})
        text = buf.getvalue()
        self._f.write(text[:len(text) // 2])
        self._sync()
        print("cut", flush=True)
        time.sleep(600)
    results.ResultWriter.write = cutting


if __name__ == "__main__":
    cut, delay, args = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    fake_device(delay)
    if cut != "-":
        cut_after(int(cut))
    main(["sweep", *args])
