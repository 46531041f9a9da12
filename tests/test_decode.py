"""fast-decode: its key-tile lists (CPU), what it takes and refuses (CPU), compiles for sm_80 and
sm_90 without spills (CPU, NVRTC), and passes the gate on the GPU for every pattern, grouped heads,
Tq from 1 to 16 and ragged batches."""
import numpy as np
import pytest

from attnbench.compile import compile_only
from attnbench.decode import BN, IMPL, ROWS, decode_list, kernel_defines
from attnbench.impls import Problem
from attnbench.patterns import REGISTERED, BadInput, make_mask


def _masks(T: int, causal: bool = True):
    for pat in REGISTERED:
        for p in pat.examples(T)[:2]:
            try:
                yield make_mask(pat.name, T, causal, **p)
            except BadInput:
                continue


@pytest.mark.parametrize("T", [1, 7, 100, 257, 1000])
@pytest.mark.parametrize("Tq", [1, 3, 16])
@pytest.mark.parametrize("causal", [True, False])
def test_a_list_holds_every_tile_the_positions_read_flagged_exactly(T, Tq, causal):
    """Visited: exactly the key tiles holding a key some of the last Tq positions allows; full:
    exactly those every position allows whole, ending within T."""
    if Tq > T:
        pytest.skip("Tq > T")
    n = 0
    for m in _masks(T, causal):
        rows = np.arange(T - Tq, T)
        dense = m.allowed(rows[:, None], np.arange(T)[None, :])
        nk = -(-T // BN)
        padded = np.zeros((Tq, nk * BN), bool)
        padded[:, :T] = dense
        per_tile = padded.reshape(Tq, nk, BN)
        want_visit = np.flatnonzero(per_tile.any(axis=(0, 2)))
        want_full = {int(k) for k in want_visit if (k + 1) * BN <= T and per_tile[:, k].all()}
        lst = decode_list(m, Tq)
        assert list(lst.entries >> 1) == list(want_visit), m.label()
        assert {int(e >> 1) for e in lst.entries if not e & 1} == want_full, m.label()
        n += 1
    assert n >= 8


def test_it_takes_decoding_shapes_and_refuses_the_others_with_the_reason():
    m = make_mask("streaming", 4096, True, sink=4, window=64)
    assert IMPL.unsupported(Problem(m, 2, 8, 128, "bfloat16", H_kv=2, Tq=16)) is None
    assert IMPL.unsupported(Problem(m, 3, 8, 64, "float16", H_kv=8, Tq=1, cache_lens=(4096, 1000, 64))) is None
    why = IMPL.unsupported(Problem(m, 1, 8, 128, "bfloat16"))
    assert "prefill" in why
    why = IMPL.unsupported(Problem(m, 1, 32, 128, "bfloat16", H_kv=2, Tq=8))
    assert f"exceed {ROWS}" in why and "128" in why
    assert "D=96" in IMPL.unsupported(Problem(m, 1, 8, 96, "bfloat16", Tq=1))
    assert "float32" in IMPL.unsupported(Problem(m, 1, 8, 128, "float32", Tq=1))
    doc = make_mask("document", 4096, True, doc_mean=500)
    why = IMPL.unsupported(Problem(doc, 2, 8, 128, "bfloat16", Tq=1, cache_lens=(4096, 2048)))
    assert "ragged" in why and "table" in why


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("pattern", ["dense", "streaming", "document", "custom"])
def test_compiles_without_spills(arch, D, pattern):
    mask = make_mask(pattern, 4096, True)
    reports = compile_only("decode", kernel_defines(D, "bfloat16", mask), arch)
    assert sorted(r.kernel for r in reports) == ["decode_merge", "decode_split"]
    for r in reports:
        assert 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), r


def _gate_cases():
    for pat in REGISTERED:
        for T in (100, 1000, 4096):
            for causal in (True, False) if pat.name in ("window", "dense", "document") else (True,):
                p = pat.examples(T)[0]
                for D, dtype in ((64, "bfloat16"), (128, "float16")):
                    for H, H_kv, Tq in ((8, 2, 1), (8, 2, 16), (4, 4, 5), (32, 8, 3)):
                        if Tq <= T:
                            yield pytest.param(pat.name, p, T, causal, D, dtype, H, H_kv, Tq,
                                               id=f"{pat.name}-T{T}-{'c' if causal else 'nc'}-D{D}-{dtype}-H{H}/{H_kv}-Tq{Tq}")


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params,T,causal,D,dtype,H,H_kv,Tq", list(_gate_cases()))
def test_gate(pattern, params, T, causal, D, dtype, H, H_kv, Tq):
    from attnbench.check import gate

    mask = make_mask(pattern, T, causal, **params)
    res = gate(IMPL, Problem(mask, 2, H, D, dtype, H_kv=H_kv, Tq=Tq))
    assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("streaming", {"sink": 4, "window": 64}),
                                            ("window", {"window": 256}), ("block_diagonal", {"block": 64})])
def test_gate_ragged(pattern, params):
    from attnbench.check import gate

    mask = make_mask(pattern, 4096, True, **params)
    prob = Problem(mask, 4, 8, 128, "bfloat16", H_kv=2, Tq=4, cache_lens=(4096, 64, 1000 // 64 * 64, 3008))
    res = gate(IMPL, prob)
    assert res.ok, res


def test_list_says_which_shapes_each_implementation_takes():
    from attnbench.impls import get_impl

    assert IMPL.shapes_taken() == "decoding (Tq < Tk), grouped heads, ragged batches"
    assert get_impl("fast-tc").shapes_taken() == "prefill, grouped heads"
