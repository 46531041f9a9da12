"""The peak_mem_mb column: what an implementation allocates beyond its inputs and outputs while it
prepares and runs (attnbench.memory). CPU: fake implementations allocate through a fake meter and
the column carries exactly that, the inputs, the outputs and the reference left out; GPU: CuPy's pool
and torch's allocator measured."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import FakeImpl, NumpyRunner, host_inputs  # noqa: E402
from test_sweep import ctx_for  # noqa: E402

from attnbench import sweep as sw  # noqa: E402
from attnbench.impls import ITEMSIZE, Problem  # noqa: E402
from attnbench.memory import MIB, PeakWindow, output_bytes  # noqa: E402
from attnbench.patterns import make_mask  # noqa: E402
from attnbench.results import COLUMNS, KEY_COLUMNS, ResultWriter, read_results  # noqa: E402

SMALL = Path(__file__).parent / "data" / "small.csv"


class FakeMemory:
    """A device allocator's counters: what is allocated now, the peak since reset_peak."""

    def __init__(self):
        self.now = self.top = 0
        self.windows = []  # "start" / "stop", in order
        self.fresh_calls = 0

    def alloc(self, n):
        self.now += n
        self.top = max(self.top, self.now)

    def free(self, n):
        self.now -= n

    def start(self):
        self.windows.append("start")

    def stop(self):
        self.windows.append("stop")

    def used(self):
        return self.now

    def reset_peak(self):
        self.top = self.now

    def peak(self):
        return self.top

    def fresh(self):
        self.fresh_calls += 1


class AllocRunner(NumpyRunner):
    """Each run allocates ``run_bytes`` of scratch and frees it."""

    def __init__(self, mem, run_bytes, *a, **kw):
        super().__init__(*a, **kw)
        self.mem, self.run_bytes = mem, run_bytes

    def run(self):
        self.mem.alloc(self.run_bytes)
        super().run()
        self.mem.free(self.run_bytes)


class AllocImpl(FakeImpl):
    """prepare allocates the output, ``keep`` bytes it holds (a tile list) and ``temp`` bytes it frees
    before it returns (a host-side build's upload); each run ``run`` bytes of scratch."""

    def __init__(self, name, mem, keep=0, temp=0, run=0, **kw):
        super().__init__(name, **kw)
        self.mem, self.keep, self.temp, self.run = mem, keep, temp, run

    def prepare(self, prob, q, k, v, do=None):
        self.prepared += 1
        self.mem.alloc(output_bytes(prob))
        self.mem.alloc(self.keep)
        self.mem.alloc(self.temp)
        self.mem.free(self.temp)
        if self.raises is not None:
            raise self.raises
        return AllocRunner(self.mem, self.run, prob, q, k, v, self.factor, do)


def metered(mem, impls, **kw):
    ctx, timer = ctx_for(impls, **kw)
    ctx.memory = lambda: mem

    def inputs(shape, dtype, seed, keep="qkv"):  # the inputs on the "device": the baseline, never counted
        mem.alloc(len(keep) * int(__import__("math").prod(shape)) * ITEMSIZE[dtype])
        return host_inputs(shape, dtype, seed, keep)
    ctx.inputs = inputs
    return ctx, timer


def case(pass_name="fwd"):
    return sw.Case("seed", sw.Instance.make("streaming", True, sink=4, window=8), 64, 1, 2, 16, "float32", pass_name)


def test_the_column_carries_what_each_implementation_allocated(monkeypatch):
    mem = FakeMemory()
    impls = [AllocImpl("a", mem, keep=3 * MIB, temp=10 * MIB, run=5 * MIB),
             AllocImpl("b", mem, keep=1 * MIB, run=20 * MIB),
             AllocImpl("wrong", mem, keep=2 * MIB, factor=1.5),
             AllocImpl("raises", mem, keep=7 * MIB, raises=MemoryError("out of memory (fake)")),
             AllocImpl("f16", mem, dtypes=("float16",))]
    real = sw.reference_of

    def reference_of(*a, **kw):  # the gate's float64 reference: 100 MiB kept, 500 MiB on the way
        mem.alloc(600 * MIB)
        mem.free(500 * MIB)
        return real(*a, **kw)
    monkeypatch.setattr(sw, "reference_of", reference_of)
    ctx, _ = metered(mem, impls)
    rows = {r["impl"]: r for r in sw.run_case(case(), impls, ctx)}
    # a: the 10 MiB freed in prepare on top of the 3 it keeps (its run's 5 stay below); the first
    # prepared, so the reference ran inside its window and is left out
    assert rows["a"]["status"] == "ok" and rows["a"]["peak_mem_mb"] == 13.0
    assert rows["b"]["status"] == "ok" and rows["b"]["peak_mem_mb"] == 21.0
    # a row that fails the gate was measured all the same; one that raised, or was skipped, was not
    assert rows["wrong"]["status"] == "failed" and rows["wrong"]["peak_mem_mb"] == 2.0
    assert rows["raises"]["status"] == "failed" and "peak_mem_mb" not in rows["raises"]
    assert rows["f16"]["status"] == "skipped" and "peak_mem_mb" not in rows["f16"]
    # every window opened was closed (the allocator given back), each after dropping cached lists
    assert mem.windows == ["start", "stop"] * 4 and mem.fresh_calls == 4


def test_a_backward_counts_beyond_its_gradients():
    mem = FakeMemory()
    impls = [AllocImpl("a", mem, keep=MIB // 2, passes=("fwd", "bwd", "fwd+bwd"))]
    for pass_name in ("bwd", "fwd+bwd"):
        ctx, _ = metered(mem, impls)
        (row,) = sw.run_case(case(pass_name), impls, ctx)
        assert row["status"] == "ok", row["reason"]
        assert row["peak_mem_mb"] == 0.5


def test_without_a_meter_the_column_stays_empty(tmp_path):
    impls = [FakeImpl("a")]
    ctx, _ = ctx_for(impls)
    assert ctx.memory is None
    rows = sw.run_case(case(), impls, ctx)
    assert "peak_mem_mb" not in rows[0]
    with ResultWriter(tmp_path / "r.csv") as w:
        w.write(rows)
    df = read_results(tmp_path / "r.csv")
    assert df["peak_mem_mb"].isna().all()


def test_the_column_is_written_and_read_back_and_old_files_take_it_empty(tmp_path):
    assert "peak_mem_mb" in COLUMNS and "peak_mem_mb" not in KEY_COLUMNS
    mem = FakeMemory()
    impls = [AllocImpl("a", mem, keep=3 * MIB)]
    ctx, _ = metered(mem, impls)
    rows = sw.run_case(case(), impls, ctx)
    out = tmp_path / "r.csv"
    with ResultWriter(out) as w:
        w.write(rows)
    assert read_results(out)["peak_mem_mb"].tolist() == [3.0]
    # a CSV written before the column: read back without it (NaN), resumed with it empty
    old = read_results(SMALL)
    assert old["peak_mem_mb"].isna().all()
    path = tmp_path / "old.csv"
    path.write_bytes(SMALL.read_bytes())
    warned = []
    with ResultWriter(path, resume=True, warn=warned.append) as w:
        n = len(w.done)
    assert n and any("peak_mem_mb=empty" in m for m in warned)
    assert read_results(path)["peak_mem_mb"].isna().all()


def test_the_outputs_of_each_pass():
    mask = make_mask("dense", 64)
    o = 2 * 8 * 64 * 16 * 2  # O at H = 8, whatever the key/value heads
    assert output_bytes(Problem(mask, 2, 8, 16, "bfloat16", H_kv=2)) == o == output_bytes(Problem(mask, 2, 8, 16,
                                                                                                   "bfloat16"))
    p = Problem(mask, 2, 8, 16, "float32", pass_name="bwd")
    assert output_bytes(p) == 3 * 2 * 8 * 64 * 16 * 4
    assert output_bytes(Problem(mask, 2, 8, 16, "float32", pass_name="fwd+bwd")) == 4 * 2 * 8 * 64 * 16 * 4


def test_a_window_leaves_out_what_happens_aside():
    mem = FakeMemory()
    mem.alloc(1000)  # before: the baseline
    w = PeakWindow(mem)
    w.begin()
    mem.alloc(50)
    with w.aside():
        mem.alloc(400)  # kept by what ran aside
        mem.alloc(300)
        mem.free(300)
    mem.alloc(20)  # on top of its 50
    mem.free(20)
    assert w.end() == 70
    mem.alloc(10_000)  # after the end: not the window's
    assert w.end() == 70 and mem.windows == ["start", "stop"]
    # what ran before aside counts, even when freed
    w = PeakWindow(mem)
    w.begin()
    mem.alloc(70)
    mem.free(70)
    with w.aside():
        mem.alloc(5)
    assert w.end() == 70


# ---- GPU: the device meter -------------------------------------------------------------------------
@pytest.mark.gpu
def test_cupys_pool_is_measured_and_given_back():
    import cupy

    from attnbench.memory import DeviceMemory

    meter = DeviceMemory()
    before = cupy.cuda.get_allocator()
    keep = cupy.empty(1 << 20, cupy.uint8)  # before the window: not counted
    w = PeakWindow(meter)
    w.begin()
    a = cupy.empty(10 << 20, cupy.uint8)
    del a
    b = cupy.empty(3 << 20, cupy.uint8)
    with w.aside():
        c = cupy.empty(64 << 20, cupy.uint8)
    assert w.end() == 10 << 20
    assert cupy.cuda.get_allocator() == before
    del keep, b, c


@pytest.mark.gpu
def test_torchs_allocator_is_measured_too():
    torch = pytest.importorskip("torch")
    from attnbench.memory import DeviceMemory

    torch.zeros(1, device="cuda")  # torch's CUDA state initialised
    w = PeakWindow(DeviceMemory())
    w.begin()
    t = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    del t
    assert w.end() == 8 << 20


@pytest.mark.gpu
@pytest.mark.parametrize("name,pattern,T,expect_mb", [
    ("cublas", "dense", 1024, 16.0),   # float32 scores and probabilities in one buffer: B*H*rows*T*4 = 16 MiB
    ("fast-decode", "dense", 4096, 0.0),  # split-KV partials: float32 [B, H_kv, splits, 64, D]
])
def test_a_sweep_row_on_the_device_carries_the_column(name, pattern, T, expect_mb):
    from attnbench.impls import get_impl

    impl = get_impl(name)
    decode = name == "fast-decode"
    c = sw.Case("llm", sw.Instance.make(pattern, True), T, 1, 4, 64, "float32" if name == "cublas" else "bfloat16",
                H_kv=1 if decode else None, Tq=1 if decode else None)
    ctx = sw.device_context(samples=3)
    (row,) = sw.run_case(c, [impl], ctx)
    assert row["status"] == "ok", row["reason"]
    assert row["peak_mem_mb"] >= expect_mb and row["peak_mem_mb"] > 0, row
