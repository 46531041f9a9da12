"""The float64 reference backward (attnbench.reference.reference_backward) against central finite
differences of the forward reference and against the dense formula over the whole [T, T] mask."""
import numpy as np
import pytest

from attnbench.patterns import make_mask
from attnbench.reference import reference, reference_backward, reference_forward

CASES = [("dense", True, {}), ("dense", False, {}), ("window", True, {"window": 3}),
         ("window", False, {"window": 2}), ("block_diagonal", False, {"block": 3}),
         ("streaming", True, {"sink": 2, "window": 2}), ("dilated", True, {"window": 3, "dilation": 2}),
         ("document", True, {"doc_lens": (1, 4, 4)}), ("document", False, {"doc_lens": (2, 3, 4)}),
         ("bigbird", True, {"block": 3, "random_blocks": 1})]


def inputs(T, D=3, B=1, H=2, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, T, D)) for _ in range(4))


def dense_formula(q, k, v, do, m, scale):
    """Gradients over the whole [T, T] masked score matrix, no tiles."""
    s = np.where(m, q @ k.swapaxes(-1, -2) * scale, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    p = np.exp(s - lse[..., None])
    o = p @ v
    delta = (do * o).sum(-1)
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ v.swapaxes(-1, -2)
    ds = p * (dp - delta[..., None])
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, dv, lse, delta


@pytest.mark.parametrize("name, causal, params", CASES)
def test_backward_matches_finite_differences(name, causal, params):
    T = 9
    m = make_mask(name, T, causal, **params)
    q, k, v, g = inputs(T)
    grads = reference_backward(q, k, v, g, m, "float64", tile=4, chunk_bytes=600)[:3]
    eps = 1e-6

    def loss(arrays):
        return float((reference(*arrays, m, "float64", tile=4) * g).sum())

    rng = np.random.default_rng(1)
    for which, grad in enumerate(grads):
        for _ in range(12):  # a few elements of each input, at random
            idx = tuple(int(rng.integers(n)) for n in q.shape)
            plus = [a.copy() for a in (q, k, v)]
            minus = [a.copy() for a in (q, k, v)]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd = (loss(plus) - loss(minus)) / (2 * eps)
            assert grad[idx] == pytest.approx(fd, rel=1e-6, abs=1e-8), ("dq dk dv"[3 * which:3 * which + 2], idx)


@pytest.mark.parametrize("name, causal, params", CASES)
@pytest.mark.parametrize("T, tile, chunk", [(9, 4, 600), (9, 128, 1 << 28), (13, 2, 1)])
def test_backward_equals_the_dense_formula(name, causal, params, T, tile, chunk):
    if name == "document":
        params = {"doc_lens": (1, T // 2, T - 1 - T // 2)}
    if name in ("block_diagonal", "bigbird") and T % params["block"]:
        pytest.skip("block does not divide T")
    m = make_mask(name, T, causal, **params)
    q, k, v, do = inputs(T, D=4, B=2, H=1, seed=T)
    scale = 0.37
    got = reference_backward(q, k, v, do, m, "float64", scale, chunk_bytes=chunk, tile=tile)
    want = dense_formula(q, k, v, do, m.dense(), scale)
    for a, b, what in zip(got, want, ("dq", "dk", "dv", "lse", "delta")):
        assert a.shape == b.shape and a.dtype == np.float64
        assert np.allclose(a, b, rtol=1e-12, atol=1e-12), what


def test_forward_variant_gives_the_reference_and_the_log_sum_exp():
    m = make_mask("streaming", 40, True, sink=3, window=5)
    q, k, v, _ = inputs(40, D=8)
    out, lse = reference_forward(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), m, tile=16)
    assert np.array_equal(out, reference(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), m, tile=16))
    want = dense_formula(*(a.astype(np.float32).astype(np.float64) for a in (q, k, v)), np.zeros_like(q), m.dense(),
                         1 / np.sqrt(8))[3]
    assert np.allclose(lse, want, rtol=1e-13)


def test_backward_of_16_bit_storage_reads_the_stored_values():
    from attnbench.arrays import from_float32, to_float32

    m = make_mask("window", 16, True, window=4)
    q, k, v, do = (from_float32(a.astype(np.float32), "bfloat16") for a in inputs(16, D=4))
    got = reference_backward(q, k, v, do, m, "bfloat16", tile=8)
    want = dense_formula(*(to_float32(a, "bfloat16").astype(np.float64) for a in (q, k, v, do)), m.dense(), 0.5)
    for a, b in zip(got, want):
        assert np.allclose(a, b, rtol=1e-12, atol=1e-12)
