"""On a GPU: the event timer against a host clock, the peaks, a short sweep end to end."""
import csv
import io
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.gpu

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def test_event_timer_agrees_with_a_host_clock_on_a_spin_kernel():
    import cupy

    from attnbench.timing import EventTimer

    kernel = cupy.RawModule(code=SPIN).get_function("spin")
    khz = cupy.cuda.Device().attributes.get("ClockRate") or 1_500_000
    cycles = np.int64(int(khz * 2.0))  # about 2 ms at the rated clock

    def launch():
        kernel((1,), (1,), (cycles,))

    timer = EventTimer()
    for _ in range(3):
        launch()
    events = sorted(timer.sample(launch) for _ in range(9))[4]
    n = 20
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        launch()
    cupy.cuda.Device().synchronize()
    host = (time.perf_counter() - t0) * 1e3 / n
    assert events == pytest.approx(host, rel=0.1)
    assert 0.5 < events < 8.0  # the kernel's length at any clock between a quarter and the rated one


def test_host_launch_overhead_stays_out_of_the_time():
    import cupy

    from attnbench.timing import EventTimer

    kernel = cupy.RawModule(code=SPIN).get_function("spin")
    khz = cupy.cuda.Device().attributes.get("ClockRate") or 1_500_000
    cycles = np.int64(int(khz * 0.05))  # about 50 us

    def slow_host_then_launch():
        time.sleep(0.0003)  # a 300 us host path (Python wrapper, compiled dispatch) before the launch
        kernel((1,), (1,), (cycles,))

    held = sorted(EventTimer().sample(slow_host_then_launch) for _ in range(9))[4]
    bare = sorted(EventTimer(hold_us=0).sample(slow_host_then_launch) for _ in range(9))[4]
    assert bare > 0.25  # without the hold the host's 300 us land between the events
    assert held < 0.2   # with it only the kernel's ~50 us do


def test_a_host_path_longer_than_the_hold_is_hidden_behind_a_longer_one():
    import cupy

    from attnbench.timing import HOLD_US, EventTimer

    kernel = cupy.RawModule(code=SPIN).get_function("spin")
    khz = cupy.cuda.Device().attributes.get("ClockRate") or 1_500_000
    cycles = np.int64(int(khz * 0.05))  # about 50 us

    def slow_host_then_launch():
        time.sleep(0.0015)  # a compiled forward and its autograd backward: 1.5 ms of host, past the default hold
        kernel((1,), (1,), (cycles,))

    timer = EventTimer()
    t = timer.time({"slow": slow_host_then_launch}, samples=7, warmup=1)["slow"]
    assert t.median_ms < 0.3  # the kernel's ~50 us, not the host's 1.5 ms
    assert t.hold_us >= 2 * 1500 > HOLD_US
    assert timer.sample(slow_host_then_launch) < 0.3 and timer.last_hold_us >= 2 * 1500


def test_the_timer_lets_a_run_go_once_it_is_timed():
    """A sweep times hundreds of runners, each holding its inputs and outputs: none may outlive its row."""
    import gc
    import weakref

    import cupy

    from attnbench.timing import EventTimer

    class Runner:
        def __init__(self):
            self.buf = cupy.zeros(1 << 20, dtype=cupy.float32)

        def run(self):
            time.sleep(0.0015)  # past the default hold, so the timer holds longer for it
            self.buf += 1

    timer, runner = EventTimer(), Runner()
    gone = weakref.ref(runner)
    timer.time({"r": runner.run}, samples=3, warmup=1)
    timer.sample(runner.run)
    del runner
    gc.collect()
    assert gone() is None


def test_flush_buffer_is_at_least_twice_the_l2():
    import cupy

    from attnbench.timing import L2Flusher

    f = L2Flusher()
    assert f.buf.nbytes >= 2 * cupy.cuda.Device().attributes["L2CacheSize"]


def test_peaks_are_ordered_as_on_any_tensor_core_gpu():
    from attnbench.timing import measure_peaks

    p = measure_peaks()
    assert p.tc_tflops > p.f32_tflops > 0
    assert p.copy_tbps > 0.1
    # reading alone moves at least as many bytes a second as a copy's reads plus writes, roughly
    assert p.read_tbps > 0.8 * p.copy_tbps and p.bytes_tbps == max(p.copy_tbps, p.read_tbps)


def test_a_short_sweep_end_to_end(tmp_path):
    from attnbench.cli import main
    from attnbench.impls import all_impls

    impls = all_impls()
    assert impls, "no implementation is registered"
    name = "naive" if "naive" in impls else next(iter(impls))
    out = tmp_path / "r.csv"
    r = CliRunner().invoke(main, ["sweep", "--T-min", "128", "--T-max", "256", "--pattern", "dense", "--pattern",
                                  "streaming", "--impl", name, "--time-budget", "0.5", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(Path(out).read_text())))
    assert len(rows) == 4
    assert {x["status"] for x in rows} == {"ok"}, [(x["status"], x["reason"]) for x in rows]
    for x in rows:
        assert x["gpu"] and int(x["sm_count"]) > 0 and x["git_commit"]
        assert float(x["p20_ms"]) <= float(x["median_ms"]) <= float(x["p80_ms"])
        assert int(x["samples"]) >= 10
        assert float(x["rel_err"]) <= float(x["tolerance"])
        assert 0 < float(x["roofline"]) <= 1.2
    r = CliRunner().invoke(main, ["sweep", "--T-min", "128", "--T-max", "256", "--pattern", "dense", "--pattern",
                                  "streaming", "--impl", name, "--out", str(out), "--resume"])
    assert r.exit_code == 0, r.output
    assert len(list(csv.DictReader(io.StringIO(Path(out).read_text())))) == 4
