"""The naive kernels on a GPU: every pattern against the float64 reference, poisoned outputs."""
import pytest

from attnbench.check import gate
from attnbench.cli import check_cases
from attnbench.impls import Problem, get_impl
from attnbench.patterns import PATTERNS, BadInput, make_mask

pytestmark = pytest.mark.gpu
CASES = [(n, ps, T) for n, ps, T in check_cases(sorted(PATTERNS), (1, 7, 128, 1000, 4096))]


@pytest.mark.parametrize("BH", [(1, 1), (2, 3)], ids=["B1H1", "B2H3"])
@pytest.mark.parametrize("name, params, T", CASES, ids=[f"{n}-{ps}-T{T}" for n, ps, T in CASES])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_naive_matches_reference(name, params, T, BH, causal):
    if T == 4096 and BH == (2, 3) and name == "dense":
        T = 2048  # keeps the float64 reference quick
    try:
        mask = make_mask(name, T, causal, **params)
    except BadInput as e:
        pytest.skip(f"size does not fit the pattern: {e}")
    prob = Problem(mask, BH[0], BH[1], 64 if BH != (1, 1) else 384, "float32")
    res = gate(get_impl("naive"), prob)
    assert res.ok, res.reason


def test_attention_api_on_cupy_and_torch():
    import cupy

    import attnbench
    from attnbench.reference import reference, rel_error

    q, k, v = (cupy.random.standard_normal((2, 3, 100, 64), dtype=cupy.float32) for _ in range(3))
    out = attnbench.attention(q, k, v, pattern="streaming", sink=4, window=16)
    assert isinstance(out, cupy.ndarray) and out.shape == q.shape
    ref = reference(q, k, v, make_mask("streaming", 100, True, sink=4, window=16))
    assert rel_error(out, ref) < 1e-5
    torch = pytest.importorskip("torch")
    tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
    tout = attnbench.attention(tq, tk, tv, pattern="streaming", sink=4, window=16)
    assert isinstance(tout, torch.Tensor) and tout.is_cuda
    assert rel_error(cupy.from_dlpack(tout), ref) < 1e-5
    with pytest.raises(BadInput, match="host"):
        attnbench.attention(q.get(), k, v)
    with pytest.raises(BadInput, match="contiguous"):
        attnbench.attention(q.swapaxes(1, 2), k, v)
