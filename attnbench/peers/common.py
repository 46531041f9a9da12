"""What the peers share: why torch cannot run here (``torch_reason``), CuPy and torch arrays seen as each other
through DLPack, the stream sync, and ``TorchRunner``, the runner of the torch peers (SDPA and Flex) for the three
passes."""
from __future__ import annotations

import contextlib
import importlib.util

from ..arrays import Bound, poison, unbind
from ..impls import DTYPES, Impl, Problem, Runner, device_problem
from ..serving import one_predicate

TORCH_MISSING = "torch is not installed (pip install -e '.[torch]')"
ALL_DTYPES = DTYPES


def torch_reason(flex: bool = False) -> str | None:
    try:
        import torch
    except ImportError:
        return TORCH_MISSING
    why = device_problem()
    if why:
        return why
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False: a CPU-only torch build?)"
    if flex:
        try:
            import torch.nn.attention.flex_attention  # noqa: F401
        except ImportError as e:
            return f"torch {torch.__version__} has no FlexAttention ({e}): it needs torch >= 2.5"
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (torch.compile needs it for FlexAttention)"
    return None


def row_chunks(T: int, rows: int):
    for r0 in range(0, T, rows):
        yield r0, min(T, r0 + rows)


def as_torch(a, dtype: str):
    """A CuPy storage array as a torch tensor of the real dtype, sharing memory."""
    return unbind(a, Bound(a, dtype, "torch"))


def as_cupy(t, dtype: str):
    """A torch tensor (any strides) as a CuPy storage array, sharing memory."""
    import cupy
    import torch

    if dtype == "bfloat16":
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(t)


def sync() -> None:
    import cupy

    cupy.cuda.get_current_stream().synchronize()


class TorchRunner(Runner):
    """q, k, v seen as torch tensors; each run on CuPy's current stream.

    A forward runs without autograd. A backward pass sees q, k, v as leaves that require grad
    (sharing the CuPy inputs' memory) and do as the output's gradient: ``bwd`` records the forward
    once (``save_forward``, in prepare: its graph holds the saved state, O and the row log-sum-exp)
    and each run is ``torch.autograd.grad`` through it with the graph retained; ``fwd+bwd`` runs the
    forward, then the gradient, every run. The gradients come back as CuPy storage arrays through
    DLPack, without copies.

    torch allocates a fresh output (and fresh gradients) per call, so ``poison`` fills the previous
    ones with NaN and lets them go: the caching allocator hands those blocks to the next ones of the
    same size on the same stream, which are then poisoned (best effort: it cannot be forced). The
    forward a ``bwd`` pass goes back through is never poisoned."""

    def __init__(self, prob: Problem, q, k, v, do=None):
        import torch

        self.torch = torch
        self.prob = prob
        self.pass_name = prob.pass_name
        self.device = torch.device("cuda", q.device.id)
        self._streams = {}
        self._out = None
        self._graph = None   # bwd: the recorded forward's output
        self._tgrads = None  # the last run's (dq, dk, dv), torch tensors
        self.setup = {}
        with torch.cuda.stream(self.stream()):
            self.q, self.k, self.v = (as_torch(a, prob.dtype) for a in (q, k, v))
            if self.pass_name != "fwd":
                if do is None:
                    raise ValueError(f"pass={self.pass_name} needs do=, the output's gradient")
                self.q, self.k, self.v = (t.detach().requires_grad_() for t in (self.q, self.k, self.v))
                self.do = as_torch(do, prob.dtype)

    def stream(self):
        import cupy

        ptr = cupy.cuda.get_current_stream().ptr
        s = self._streams.get(ptr)
        if s is None:
            cuda = self.torch.cuda
            s = cuda.default_stream(self.device) if ptr == 0 else cuda.ExternalStream(ptr, device=self.device)
            self._streams[ptr] = s
        return s

    def _call(self):
        raise NotImplementedError

    def _pinned(self):
        """The context the backward runs in (SDPA: its backend pinned, as for the forward)."""
        return contextlib.nullcontext()

    def save_forward(self) -> None:
        """``bwd``: the forward, recorded by autograd; every run goes back through its graph."""
        torch = self.torch
        with torch.cuda.stream(self.stream()), torch.enable_grad():
            self._graph = self._call()
        self._out = self._graph.detach()

    def run(self) -> None:
        torch = self.torch
        with torch.cuda.stream(self.stream()):
            if self.pass_name == "fwd":
                with torch.no_grad():
                    self._out = self._call()
                return
            with torch.enable_grad():
                out = self._graph if self.pass_name == "bwd" else self._call()
                with self._pinned():
                    self._tgrads = torch.autograd.grad(out, (self.q, self.k, self.v), self.do,
                                                       retain_graph=self.pass_name == "bwd")
            if self.pass_name == "fwd+bwd":
                self._out = out.detach()

    @property
    def out(self):
        return as_cupy(self._out, self.prob.dtype)

    @property
    def grads(self):
        if self._tgrads is None:
            return None
        return tuple(as_cupy(g, self.prob.dtype) for g in self._tgrads)

    def poison(self) -> None:
        if self._out is not None and self.pass_name != "bwd":
            poison(self.out)
            self._out = None
        for g in self.grads or ():
            poison(g)
        self._tgrads = None


class TorchImpl(Impl):
    """What the torch peers refuse alike: beyond ``Impl.unsupported``, a ragged batch that one predicate cannot take
    (``serving.one_predicate``: the pattern's predicate or table depends on the cache length)."""

    def unsupported(self, prob: Problem) -> str | None:
        why = super().unsupported(prob)
        if why:
            return why
        why = one_predicate(prob)
        return f"{self.name}: {why}" if why else None
