"""Peer baselines: registration and availability without torch, the pattern predicate as a
FlexAttention mask_mod (where torch exists), and every peer through the correctness gate on
a device."""
import dataclasses
import os
import subprocess
import sys
import types
import zlib

import numpy as np
import pytest

from attnbench import peers
from attnbench.check import gate, judge
from attnbench.impls import Problem, all_impls, get_impl
from attnbench.patterns import PATTERNS, BadInput, examples, make_mask

PEERS = ("cublas", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex")
TORCH_PEERS = PEERS[1:]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# sizes that fit each T (block sizes divide it)
BLOCK = {7: 7, 48: 8, 64: 16, 100: 10, 128: 16, 1000: 8, 4096: 64}
WINDOW = {7: 3, 48: 5, 64: 16, 100: 9, 128: 16, 1000: 64, 4096: 256}
SINK = {7: 2, 48: 3, 64: 4, 100: 7, 128: 4, 1000: 16, 4096: 16}


def cases(T, seed=0):
    """(pattern, causal, params) covering every pattern at T."""
    blk, w = BLOCK[T], WINDOW[T]
    bigbird = dict(block=blk, window_blocks=3, global_blocks=1, random_blocks=min(3, T // blk), seed=seed)
    return [
        ("dense", True, {}),
        ("dense", False, {}),
        ("window", True, dict(window=w)),
        ("window", False, dict(window=w)),
        ("streaming", True, dict(sink=SINK[T], window=w)),
        ("block_diagonal", False, dict(block=blk)),
        ("dilated", True, dict(window=max(1, w // 2), dilation=2)),
        ("dilated", False, dict(window=max(1, w // 2), dilation=3)),
        ("bigbird", True, bigbird),
        ("bigbird", False, bigbird),
    ]


def registry_cases(T, seed=0):
    """cases(T), and the first examples of every registered pattern it does not name."""
    named = {c[0] for c in cases(T)}
    return cases(T, seed) + [(n, c, ps) for n, c, ps in examples(T) if n not in named and ps == PATTERNS[n].examples(T)[0]]


def _id(case):
    pattern, causal, params = case
    ps = ",".join(f"{k}={v}" for k, v in params.items())
    return f"{pattern}{'-causal' if causal else ''}({ps})"


# -- registration and availability (no device, no torch needed) ----------------------------------
def test_peers_are_registered_as_family_peer():
    impls = all_impls()
    for name in PEERS:
        assert name in impls, name
        impl = impls[name]
        assert impl.family == "peer"
        assert impl.description
        assert set(impl.dtypes) <= {"float32", "float16", "bfloat16"}
    # flash and cuDNN have no float32 kernels; the others take every dtype
    assert "float32" not in impls["sdpa-flash"].dtypes and "float32" not in impls["sdpa-cudnn"].dtypes
    for name in ("cublas", "sdpa-efficient", "sdpa-math", "flex"):
        assert set(impls[name].dtypes) == {"float32", "float16", "bfloat16"}


def test_torch_peers_say_torch_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    for name in TORCH_PEERS:
        assert get_impl(name).availability().startswith("torch is not installed"), name
    why = get_impl("cublas").availability()
    assert why is None or "torch" not in why


def test_torch_peers_say_there_is_no_cuda_device(monkeypatch):
    fake = types.ModuleType("torch")
    fake.__version__ = "0.0-fake"
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    for name in TORCH_PEERS:
        assert get_impl(name).availability().startswith("no CUDA device"), name


def test_importing_peers_does_not_import_torch(tmp_path):
    # an importable stand-in for torch: any eager `import torch` would put it in sys.modules
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    code = "import sys, attnbench.peers; assert 'torch' not in sys.modules, 'torch imported eagerly'"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _prob(pattern, T, causal=True, dtype="bfloat16", D=64, H=2, **params):
    return Problem(make_mask(pattern, T, causal, **params), B=1, H=H, D=D, dtype=dtype)


def test_flash_takes_no_mask_and_no_float32():
    flash = get_impl("sdpa-flash")
    why = flash.unsupported(_prob("window", 128, window=16))
    assert "attn_mask" in why and "window" in why
    why = flash.unsupported(_prob("dense", 128, dtype="float32"))
    assert "float32" in why
    assert "float32" in get_impl("sdpa-cudnn").unsupported(_prob("dense", 128, dtype="float32"))


def test_sdpa_refuses_masks_above_the_limit():
    eff = get_impl("sdpa-efficient")
    big = _prob("window", 65536, window=256, H=16)
    assert peers.sdpa_mask_bytes(65536, "bfloat16") > peers.SDPA_MASK_BYTES
    why = eff.unsupported(big)
    assert "GiB" in why and "T=65536" in why
    with pytest.raises(BadInput):
        eff.require(big)
    # the llm configuration at T = 32768 is within it
    assert peers.sdpa_mask_bytes(32768, "bfloat16") <= peers.SDPA_MASK_BYTES
    why = eff.unsupported(_prob("window", 32768, window=256, H=16))
    assert why is None or "GiB" not in why
    # dense attention needs no mask at any T
    why = eff.unsupported(_prob("dense", 131072, H=16))
    assert why is None or "GiB" not in why


def test_sdpa_math_materialises_its_scores_and_refuses_them_above_the_limit():
    math_ = get_impl("sdpa-math")
    assert math_.backend == "MATH" and math_.takes_mask and math_.materializes
    assert math_.gqa and math_.decode and math_.ragged and math_.passes == ("fwd", "bwd", "fwd+bwd")
    assert not any(get_impl(n).materializes for n in ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"))
    # the llm configuration at T = 4096 fits (16 heads: 2 x 1 GiB of float32 scores and probabilities) ...
    ok = _prob("dense", 4096, H=16)
    assert peers.sdpa_math_bytes(ok) == 2 * 16 * 4096 * 4096 * 4 <= peers.SDPA_MATH_BYTES
    why = math_.unsupported(ok)
    assert why is None or "GiB" not in why
    # ... at T = 32768 it does not, dense too (no mask needed, the scores all the same)
    why = math_.unsupported(_prob("dense", 32768, H=16))
    assert why and "sdpa-math" in why and "materialises" in why and "128.0 GiB" in why and "4 GiB limit" in why
    with pytest.raises(BadInput, match="materialises"):
        math_.require(_prob("dense", 32768, H=16))
    # a backward holds twice as much: 3 GiB for the forward, 6 with the backward
    fwd = _prob("dense", 8192, H=6)
    bwd = Problem(fwd.mask, 1, 6, 64, "bfloat16", pass_name="bwd")
    assert peers.sdpa_math_bytes(bwd) == 2 * peers.sdpa_math_bytes(fwd) == 6 << 30
    assert "GiB" not in (math_.unsupported(fwd) or "") and "6.0 GiB" in math_.unsupported(bwd)
    # decoding: the scores of Tq queries only (B=64 x 32 heads x Tk=131072 at Tq=1: 2 GiB, fits; Tq=16 does not)
    dec = Problem(make_mask("dense", 131072), B=64, H=32, D=128, dtype="bfloat16", H_kv=8, Tq=1)
    assert peers.sdpa_math_bytes(dec) == 2 * 64 * 32 * 131072 * 4
    why = math_.unsupported(dec)
    assert why is None or "materialises" not in why
    dec16 = Problem(make_mask("dense", 131072), B=64, H=32, D=128, dtype="bfloat16", H_kv=8, Tq=16)
    assert "[64, 32, 16, 131072]" in math_.unsupported(dec16)


def test_flex_refuses_head_dims_it_has_no_kernel_for():
    why = get_impl("flex").unsupported(_prob("dense", 128, D=48))
    assert "D=48" in why


@pytest.mark.parametrize("B,H,T,dtype", [(1, 1, 7, "float32"), (1, 2, 1000, "float16"), (1, 16, 4096, "bfloat16"),
                                         (1, 16, 32768, "bfloat16"), (1, 16, 131072, "bfloat16"),
                                         (2, 16, 131072, "float32"), (1, 4096, 131072, "float32")])
def test_cublas_chunk_stays_within_scratch(B, H, T, dtype):
    rows = peers.cublas_rows(B, H, T, dtype)
    assert 1 <= rows <= T
    per_row = B * H * T * (4 + (0 if dtype == "float32" else 2))
    assert rows == 1 or rows * per_row <= peers.cublas.SCRATCH_BYTES
    if rows < T:  # as large as the budget allows, to a multiple of 64 when that is possible
        assert (rows + 64 if rows >= 64 else rows + 1) * per_row > peers.cublas.SCRATCH_BYTES


def test_flex_block_64_pins_the_kernel_blocks():
    assert peers.flex_kernel_options(64) == {"BLOCK_M": 64, "BLOCK_N": 64}
    assert peers.flex_kernel_options(128) is None
    assert set(peers.FLEX_BLOCKS) == {64, 128}


# -- the pattern predicate as a FlexAttention mask_mod (needs torch, not a device) ---------------
MOD_CASES = [(T, c) for T in (48, 64, 100) for c in registry_cases(T, seed=T)] + [
    (64, ("streaming", False, dict(sink=0, window=1))),
    (64, ("dilated", True, dict(window=1, dilation=5))),
    (64, ("bigbird", True, dict(block=8, window_blocks=1, global_blocks=0, random_blocks=0))),
    (64, ("bigbird", False, dict(block=16, window_blocks=5, global_blocks=2, random_blocks=4, seed=9))),
]


@pytest.mark.parametrize("T,case", MOD_CASES, ids=[f"T{T}-{_id(c)}" for T, c in MOD_CASES])
def test_mask_mod_equals_dense_mask(T, case):
    torch = pytest.importorskip("torch")
    pattern, causal, params = case
    mask = make_mask(pattern, T, causal, **params)
    mod = mask.mask_mod("cpu")
    q = torch.arange(T)[:, None]
    kv = torch.arange(T)[None, :]
    zero = torch.zeros((), dtype=torch.int64)
    got = mod(zero, zero, q, kv)
    assert got.dtype == torch.bool
    np.testing.assert_array_equal(got.numpy(), mask.dense())
    # and element by element through vmap, as create_mask / create_block_mask call it
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    dense = flex.create_mask(mod, 1, 1, T, T, device="cpu")
    np.testing.assert_array_equal(dense[0, 0].numpy(), mask.dense())


# -- on a device: every peer through the gate ----------------------------------------------------
def _must_run(name, prob):
    """Combinations a peer is known to take: an unsupported reason there is a failure."""
    if name in ("cublas", "flex", "sdpa-efficient", "sdpa-math"):
        return True
    if name == "sdpa-flash":
        return prob.mask.pattern.name == "dense" and prob.dtype != "float32"
    return False  # sdpa-cudnn: depends on the cuDNN version and the GPU


def _ready(name, prob, pin_block=True):
    impl = get_impl(name)
    why = impl.availability()
    if why:
        pytest.skip(f"{name}: {why}")
    why = impl.unsupported(prob)
    if why:
        assert isinstance(why, str) and why.strip()
        assert not _must_run(name, prob), f"{name} refused {prob.mask.label()} {prob.dtype} {prob.pass_name}: {why}"
        with pytest.raises(BadInput):
            impl.require(prob)
        pytest.skip(why)
    if name == "flex" and pin_block and prob.pass_name != "fwd":
        # a backward: one setting (block 128, Flex's defaults), a compile per case; the pick has its tests
        impl = dataclasses.replace(impl, bwd_settings=peers.FLEX_BWD_SETTINGS[:1])
    elif name == "flex" and pin_block:
        # one block size per case, either by turns, to halve the compiles; the pick has its own test
        key = f"{prob.mask.label()} {prob.mask.causal} {prob.T} {prob.dtype}".encode()
        impl = dataclasses.replace(impl, blocks=(64,) if zlib.crc32(key) % 2 else (128,))
    return impl


# bfloat16 at an odd and a mid size, the other dtypes at one size: every peer compiles per case
GATE = [(name, T, "bfloat16", c) for T in (7, 1000) for c in registry_cases(T) for name in PEERS]
GATE += [(name, 128, dtype, c) for dtype in ("float16", "float32") for c in cases(128) for name in PEERS]
GATE += [(name, 4096, "bfloat16", c) for c in cases(4096) for name in PEERS]


@pytest.mark.gpu
@pytest.mark.parametrize("name,T,dtype,case", GATE, ids=[f"{n}-T{T}-{d}-{_id(c)}" for n, T, d, c in GATE])
def test_peer_passes_gate(name, T, dtype, case):
    pattern, causal, params = case
    prob = _prob(pattern, T, causal, dtype=dtype, **params)
    impl = _ready(name, prob)
    res = gate(impl, prob)
    assert res.ok, f"{name} {prob.mask.label()} T={T} {dtype}: {res.reason}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", PEERS)
def test_peer_runs_on_cupys_current_stream_without_copies(name):
    import cupy

    from attnbench.arrays import random_inputs

    prob = _prob("streaming", 128, sink=4, window=16)
    impl = _ready(name, prob)
    with cupy.cuda.Stream(non_blocking=True):
        q, k, v = random_inputs(prob.shape, prob.dtype, 11)
        runner = impl.prepare(prob, q, k, v)
        res = judge(impl, prob, runner, q, k, v)
    assert res.ok, res.reason
    if name != "cublas":
        assert runner.q.data_ptr() == q.data.ptr and runner.v.data_ptr() == v.data.ptr
        assert runner.out.data.ptr == runner._out.data_ptr()


@pytest.mark.gpu
def test_flex_picks_a_block_size_and_records_its_setup():
    from attnbench.arrays import random_inputs

    prob = _prob("window", 1024, window=64)
    impl = _ready("flex", prob, pin_block=False)
    assert impl.blocks == peers.FLEX_BLOCKS
    runner = impl.prepare(prob, *random_inputs(prob.shape, prob.dtype, 5))
    assert runner.setup["flex_block"] in peers.FLEX_BLOCKS
    assert runner.setup["compile_s"] > 0 and runner.setup["block_mask_build_s"] > 0
    assert tuple(runner.block_mask.BLOCK_SIZE) == (runner.setup["flex_block"],) * 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cublas", "sdpa-efficient"])
def test_mask_build_is_setup(name):
    from attnbench.arrays import random_inputs

    prob = _prob("bigbird", 256, block=16)
    impl = _ready(name, prob)
    runner = impl.prepare(prob, *random_inputs(prob.shape, prob.dtype, 6))
    assert runner.setup["mask_build_s"] > 0


MATH_SHAPES = [  # (pattern, params, T, causal, B, H, H_kv, Tq, lens, dtype)
    ("dense", {}, 1000, True, 2, 4, None, None, None, "bfloat16"),
    ("bigbird", {"block": 8}, 1000, True, 1, 8, 2, None, None, "bfloat16"),
    ("window", {"window": 64}, 1000, False, 1, 4, 4, None, None, "float16"),
    ("dense", {}, 4096, True, 2, 8, 2, 1, None, "bfloat16"),
    ("streaming", {"sink": 4, "window": 64}, 4096, True, 2, 8, 2, 16, None, "bfloat16"),
    ("dense", {}, 1024, True, 3, 8, 1, 4, (1024, 512, 333), "bfloat16"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params,T,causal,B,H,H_kv,Tq,lens,dtype", MATH_SHAPES,
                         ids=[f"{p}-T{T}-B{B}H{H}Hkv{hk}-Tq{tq}{'-ragged' if ls else ''}-{dt}"
                              for p, _, T, _, B, H, hk, tq, ls, dt in MATH_SHAPES])
def test_sdpa_math_passes_the_gate_on_prefill_and_decode_shapes(pattern, params, T, causal, B, H, H_kv, Tq, lens,
                                                                 dtype):
    prob = Problem(make_mask(pattern, T, causal, **params), B=B, H=H, D=64, dtype=dtype, H_kv=H_kv, Tq=Tq,
                   cache_lens=lens)
    impl = _ready("sdpa-math", prob)
    res = gate(impl, prob)
    assert res.ok, f"sdpa-math {prob.mask.label()} H_kv={H_kv} Tq={Tq} lens={lens}: {res.reason}"


@pytest.mark.gpu
def test_unsupported_combinations_are_refused_before_any_work():
    from attnbench.arrays import random_inputs

    for name, prob in [("sdpa-flash", _prob("window", 128, window=16)),
                       ("sdpa-flash", _prob("dense", 128, dtype="float32")),
                       ("sdpa-cudnn", _prob("dense", 128, dtype="float32")),
                       ("sdpa-efficient", _prob("window", 65536, window=256, H=1)),
                       ("sdpa-math", _prob("dense", 32768, H=16)),
                       ("flex", _prob("dense", 128, D=48))]:
        impl = get_impl(name)
        if impl.availability():
            continue
        assert impl.unsupported(prob)
        q = k = v = random_inputs((1, 1, 8, prob.D), prob.dtype, 1)[0]  # never read: refused first
        with pytest.raises(BadInput):
            impl.prepare(prob, q, k, v)


# ---- serving shapes: grouped heads, decoding, ragged batches --------------------------------------
def _serving(pattern, T=1024, H=8, H_kv=2, Tq=1, cache_lens=None, dtype="bfloat16", D=64, B=None, **params):
    B = B or (len(cache_lens) if cache_lens else 2)
    return Problem(make_mask(pattern, T, True, **params), B=B, H=H, D=D, dtype=dtype, H_kv=H_kv, Tq=Tq,
                   cache_lens=cache_lens)


def test_sdpa_needs_a_mask_for_a_decode_but_one_dense_query_per_sequence():
    """SDPA's is_causal aligns its diagonal top-left: a decode's queries (the last Tq positions)
    take an attn_mask, but for one query of equal-length sequences dense allows every key."""
    mode = peers.sdpa._sdpa_mode
    assert mode(_prob("dense", 128)) == "causal" and mode(_prob("dense", 128, causal=False)) == "none"
    assert mode(_serving("dense", Tq=1)) == "none"
    assert mode(_serving("dense", Tq=16)) == "mask"
    assert mode(_serving("dense", Tq=1, cache_lens=(1024, 512))) == "mask"
    assert mode(_serving("window", Tq=1, window=64)) == "mask"
    why = get_impl("sdpa-flash").unsupported(_serving("dense", Tq=16))
    assert why and "attn_mask" in why


def test_the_torch_peers_take_serving_shapes_and_refuse_a_ragged_batch_of_a_length_dependent_predicate():
    for name in TORCH_PEERS:
        impl = get_impl(name)
        assert impl.gqa and impl.decode and impl.ragged, name
    assert not get_impl("cublas").decode
    ragged = _serving("bigbird", T=1024, cache_lens=(1024, 512), block=64)
    for name in ("sdpa-efficient", "flex"):
        why = get_impl(name).unsupported(ragged)
        assert why and "ragged" in why and "depends on the cache length" in why


SERVING = [("dense", {}, 1, None), ("dense", {}, 16, None), ("streaming", {"sink": 4, "window": 64}, 1, None),
           ("window", {"window": 256}, 16, None), ("dense", {}, 1, (1024, 512)),
           ("streaming", {"sink": 4, "window": 64}, 4, (1024, 320))]


@pytest.mark.gpu
@pytest.mark.parametrize("name", TORCH_PEERS)
@pytest.mark.parametrize("pattern,params,Tq,lens", SERVING,
                         ids=[f"{p}-Tq{tq}{'-ragged' if ls else ''}" for p, _, tq, ls in SERVING])
def test_peer_passes_the_gate_on_serving_shapes(name, pattern, params, Tq, lens):
    prob = _serving(pattern, T=1024, Tq=Tq, cache_lens=lens, **params)
    impl = get_impl(name)
    why = impl.availability() or impl.unsupported(prob)
    if why:
        pytest.skip(why)
    if name == "flex":
        impl = dataclasses.replace(impl, blocks=(128,))
    res = gate(impl, prob)
    assert res.ok, f"{name} {prob.mask.label()} Tq={Tq} lens={lens}: {res.reason}"
