"""fast-decode: its key-tile lists (CPU), what it takes and refuses (CPU), compiles for sm_80 and
sm_90 without spills (CPU, NVRTC), and passes the gate on the GPU for every pattern, grouped heads,
Tq from 1 to 16 and ragged batches."""
from dataclasses import replace

import numpy as np
import pytest

from attnbench.compile import compile_only
from attnbench.decode import IMPL, KEYS_KERNEL, KERNEL, decode_list
from attnbench.decode_config import BN, ROWS, kernel_defines
from attnbench.decode_config import DEFAULT as DEFAULT_CFG
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


@pytest.mark.parametrize("T", [7, 100, 1000, 4096])
@pytest.mark.parametrize("Tq", [1, 16])
@pytest.mark.parametrize("bn", [32, 64, 128])
def test_a_lists_spans_leave_out_only_keys_no_position_reads(T, Tq, bn):
    """The kernels' entries (SPANS): each names the list's tile and flag, and a span of it in 16-key steps; every
    key outside the span is one that none of the last Tq positions allows (the loads zero-fill those rows, and a
    partial tile's mask covers them). Without spans every tile is whole. The sinks' tile of streaming 4+64 holds
    keys past its span."""
    from attnbench.decode import SPAN_UNIT

    if Tq > T:
        pytest.skip("Tq > T")
    skipped = 0
    for m in _masks(T):
        lst = decode_list(m, Tq, bn)
        dev = lst.device_entries(bn).astype(np.int64)
        assert list(dev >> 9) == list(lst.entries >> 1) and list(dev & 1) == list(lst.entries & 1), m.label()
        lo, tail = (dev >> 5 & 15) * SPAN_UNIT, (dev >> 1 & 15) * SPAN_UNIT
        rows = np.arange(T - Tq, T)
        for kt, a, t in zip(dev >> 9, lo, tail):
            keys = kt * bn + np.concatenate([np.arange(a), np.arange(bn - t, bn)])
            keys = keys[keys < T]
            assert not m.allowed(rows[:, None], keys[None, :]).any(), (m.label(), int(kt))
            skipped += keys.size
        whole = lst.device_entries(bn, spans=False).astype(np.int64)
        assert list(whole >> 9) == list(dev >> 9) and not (whole & 0x1FE).any()
        assert lst.span_keys(bn, False) == bn * lst.entries.size >= lst.span_keys(bn)
    sinks = decode_list(make_mask("streaming", T, True, sink=4, window=64), Tq, bn)
    if T >= 1000 and bn > SPAN_UNIT:
        assert skipped > 0 and sinks.span_keys(bn) < sinks.span_keys(bn, False)


def test_a_cache_longer_than_the_lists_can_name_is_refused():
    from attnbench.decode import MAX_TILES

    m = make_mask("streaming", MAX_TILES * 32 + 1, True, sink=4, window=64)
    why = IMPL.unsupported(Problem(m, 1, 8, 128, "bfloat16", H_kv=8, Tq=1))
    assert f"at most {MAX_TILES} tiles" in why and f"T={MAX_TILES * 32 + 1}" in why
    m = make_mask("streaming", MAX_TILES * 32, True, sink=4, window=64)
    assert IMPL.unsupported(Problem(m, 1, 8, 128, "bfloat16", H_kv=8, Tq=1)) is None


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
@pytest.mark.parametrize("keys", [False, True])
def test_compiles_without_spills(arch, D, pattern, keys):
    mask = make_mask(pattern, 4096, True)
    reports = compile_only(KEYS_KERNEL if keys else KERNEL, kernel_defines(D, "bfloat16", mask, keys=keys), arch)
    assert sorted(r.kernel for r in reports) == sorted(["decode_merge", "decode_keys_split" if keys else "decode_split"])
    for r in reports:
        assert 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), r


@pytest.mark.parametrize("kernel,entry", [("decode", "decode_split"), ("decode_keys", "decode_keys_split"),
                                          ("decode_pairs", "decode_pairs")])
def test_the_split_launch_takes_the_list_head_the_host_packs(kernel, entry):
    """The split kernels' last parameter is the structure ``list_head`` packs: tent's first HEAD_ENTRIES
    entries, zeros past a shorter list, by value (its size in the PTX is the host's), and the kernels read
    entries there below HEAD_ENTRIES (a parameter load at a computed address) and from tent above."""
    import re

    from attnbench.compile import ptx
    from attnbench.decode_config import HEAD_DTYPE, HEAD_ENTRIES
    from attnbench.decode import list_head

    tent = np.arange(1, 300, dtype=np.int32)
    head = list_head(tent)
    assert head.dtype == HEAD_DTYPE and head.shape == (1,) and head.nbytes == 4 * HEAD_ENTRIES
    assert list(head["e"][0]) == list(tent[:HEAD_ENTRIES])
    short = list_head(np.array([6, 9, 0], np.int32))["e"][0]
    assert list(short[:3]) == [6, 9, 0] and not short[3:].any()

    mask = make_mask("streaming", 4096, True)
    text = ptx(kernel, kernel_defines(128, "bfloat16", mask, keys=kernel == "decode_keys",
                                      pairs=kernel == "decode_pairs"), "sm_80")
    split = text[text.index(".entry " + entry + "("):]
    params = re.findall(r"\.param (.*?)" + entry + r"_param_(\d+)(\[\d+\])?", split[:split.index(")")])
    last = params[-1]
    assert ".b8" in last[0] and last[2] == f"[{HEAD_DTYPE.itemsize}]", params
    at = f"{entry}_param_{last[1]}"
    assert re.search(r"mov\.b64\s+%rd\d+, " + at, split) and "ld.param.u32" in split


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


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("window", {"window": 3000})])
def test_a_ragged_batch_takes_more_splits_and_still_passes_the_gate(pattern, params):
    """RAGGED=1 (the default) gives the long sequence of a ragged batch more splits than RAGGED=0, which counts
    them from the longest list alone; both pass the gate. The decode configuration's shape at B=8 on a small
    scale: 8 key/value heads, one query a sequence, the merge launch."""
    setups = _ragged_gates(make_mask(pattern, 16384, True, **params), 1, 32, 8,
                           {r: f"RAGGED={r},CLUSTER=0,FLAT=0" for r in (0, 1)})
    splits = {r: s["splits"] for r, s in setups.items()}
    longest = -(-16384 // 64)
    if pattern == "dense":  # 256 tiles the longest, 518 in all: the lists differ
        assert splits[1] > splits[0], splits
    assert splits[0] >= 1 and splits[1] <= -(-longest // DEFAULT.MIN_PER_SPLIT)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params,Tq,H,H_kv", [("dense", {}, 1, 32, 8), ("window", {"window": 3000}, 1, 32, 8),
                                                      ("dense", {}, 4, 8, 2), ("window", {"window": 3000}, 2, 16, 2)])
def test_a_ragged_batch_walked_flat_passes_the_gate(pattern, params, Tq, H, H_kv):
    """FLAT=1 (the default) lays a ragged batch's lists end to end and cuts them into one wave of equal runs, a
    block's run crossing pairs; FLAT=0 splits each pair's list on its own. Both pass the gate, one query or several
    a sequence (the key slices' kernel: lists past 2048 keys, whose 64-key tiles it takes), the merge launch weighing
    every pair's slots (CLUSTER=0, so the short lists take it too)."""
    setups = _ragged_gates(make_mask(pattern, 16384, True, **params), Tq, H, H_kv,
                           {f: f"FLAT={f},CLUSTER=0" for f in (0, 1)})
    assert "flat_blocks" not in setups[0]
    s = setups[1]
    assert s["kernel"] == "decode_keys" and s["flat_stretches"] > s["flat_blocks"] > 1, s


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params,B", [("dense", {}, 1), ("dense", {}, 3), ("window", {"window": 3000}, 2)])
def test_a_batch_of_one_length_walked_flat_passes_the_gate(pattern, params, B):
    """FLAT=2 walks a batch whose lists are of one length flat as well (FLAT=1 only ragged ones): runs of equal
    tiles, where the grid took pairs x splits blocks. Both pass the gate, one query a sequence. (A run crosses pairs
    where its tiles do not divide a list's: B=3's 24 lists of 256 tiles in 256 runs of 24; B=1's 8 lists in 128 runs
    of 16 do not.)"""
    mask = make_mask(pattern, 16384, True, **params)
    setups = _ragged_gates(mask, 1, 32, 8, {f: f"FLAT={f},CLUSTER=0" for f in (1, 2)}, lens=(16384,) * B)
    assert "flat_blocks" not in setups[1]
    s = setups[2]
    assert s["kernel"] == "decode_keys" and s["flat_stretches"] >= s["flat_blocks"] > 1, s
    if B == 3:
        assert s["flat_stretches"] > s["flat_blocks"], s


def _ragged_gates(mask, Tq: int, H: int, H_kv: int, specs: dict,
                  lens=(16384, 4096, 1024, 2048, 8192, 64, 3008, 1000)) -> dict:
    """fast-decode with each of ``specs``' shapes through the gate on one batch of ``lens`` keys (by default a
    ragged batch of 8 sequences: one of 16384 keys, one of 64, the others between, 1000 and 3008 off the tiles'
    edges): each shape's setup."""
    from attnbench.arrays import random_inputs
    from attnbench.check import judge

    prob = Problem(mask, len(lens), H, 128, "bfloat16", H_kv=H_kv, Tq=Tq, cache_lens=lens)
    q = random_inputs(prob.shape, prob.dtype, 3)[0]
    _, k, v = random_inputs(prob.kv_shape, prob.dtype, 4)
    setups = {}
    for key, spec in specs.items():
        variant = IMPL.decode_variant(parse_decode_config(spec))
        runner = variant.prepare(prob, q, k, v)
        res = judge(variant, prob, runner, q, k, v)
        assert res.ok, (spec, res)
        setups[key] = runner.setup
    return setups


@pytest.mark.gpu
@pytest.mark.parametrize("spec,kernel", [("", "decode"), ("NWARPS=8,KWG=2,CLUSTER=0", "decode"), ("BN_SHORT=0", "decode_keys"),
                                         ("BY_PAIRS=1", "decode_pairs")])
@pytest.mark.parametrize("pattern,params", [("streaming", {"sink": 4, "window": 1000}),
                                            ("streaming", {"sink": 16, "window": 64}),
                                            ("dilated", {"window": 512, "dilation": 2})])
def test_tiles_loaded_by_their_spans_pass_the_gate_and_read_fewer_bytes(spec, kernel, pattern, params):
    """SPANS=1 (the default) and SPANS=0 through the gate on each kernel (the rows kernel with one and two warpgroups,
    the key slices, a warp a pair), with a sinks' tile and a window's first tile partly outside what the queries
    read; where the sinks' tile holds keys past the sinks, the launch's K and V bytes (``kv_bytes``) fall with the
    spans."""
    Tq, H = (16, 8) if kernel == "decode" else (1, 8)
    specs = {x: ",".join(filter(None, [spec, f"SPANS={x}"])) for x in (0, 1)}
    setups = _ragged_gates(make_mask(pattern, 8192, True, **params), Tq, H, 2, specs, lens=(8192, 8192 - 40))
    assert {s["kernel"] for s in setups.values()} == {kernel}, setups
    if pattern == "streaming":
        assert setups[1]["kv_bytes"] < setups[0]["kv_bytes"], setups


def test_list_says_which_shapes_each_implementation_takes():
    from attnbench.impls import get_impl

    assert IMPL.shapes_taken() == "decoding (Tq < Tk), grouped heads, ragged batches"
    assert get_impl("fast-tc").shapes_taken() == "prefill, grouped heads"


# ---- its shape, for tuning: --decode-config and ATTNBENCH_DECODE_CONFIG ------------------------------
from attnbench.decode_config import (DEFAULT, ENV, DecodeConfig, flat_stretches, parse_decode_config, ragged_splits,  # noqa: E402
                                     split_count)

# the choices of scripts/gpu_check.sh's decodeshapes step (DECODE_SHAPES' default)
GPU_CHECK_SHAPES = ("BY_KEYS=0", "SPLITS=8", "SPLITS=16", "STAGES=2", "STAGES=4", "STAGES=2,MINB=3", "BN=128,STAGES=2",
                    "BY_KEYS=0,SPLITS=16")


def test_the_gpu_check_step_sweeps_these_shapes():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "scripts" / "gpu_check.sh").read_text()
    assert f'DECODE_SHAPES:-{" ".join(GPU_CHECK_SHAPES)}' in text


def test_the_readme_names_the_decode_shapes_fields_and_defaults():
    """The README's `--decode-config` row lists DecodeConfig's fields in order and their defaults as they are."""
    import re
    from pathlib import Path

    from attnbench.decode_config import DECODE_FIELDS

    text = (Path(__file__).parents[1] / "README.md").read_text()
    got = re.search(r"fields `([A-Z_ ]+)` as `FIELD=N,...`, the others at their defaults `([0-9,]+)`", text)
    assert got, "the README's --decode-config row"
    assert tuple(got.group(1).split()) == DECODE_FIELDS
    assert got.group(2) == ",".join(str(getattr(DEFAULT, f)) for f in DECODE_FIELDS)


@pytest.mark.parametrize("text, given", [
    ("SPLITS=8", (("SPLITS", 8),)),
    ("stages=4, bn=32", (("BN", 32), ("STAGES", 4))),
    ("BLOCKS_PER_SM=0,MIN_PER_SPLIT=2", (("BLOCKS_PER_SM", 0), ("MIN_PER_SPLIT", 2))),
    ("8,32,4", (("NWARPS", 8), ("BN", 32), ("STAGES", 4), ("MINB", 1), ("SPLITS", 0), ("BLOCKS_PER_SM", 0),
                ("MIN_PER_SPLIT", 4), ("MERGE", 0), ("BY_KEYS", 2), ("ONE_PER_SM", 8), ("CLASSES", 1),
                ("BN_SHORT", 32), ("PDL", 1), ("CLUSTER", 9), ("CLUSTER_TILES", 9), ("CLUSTER_ROWS", 64),
                ("BY_PAIRS", 2), ("HEADS", 0), ("WG", 1), ("KWG", 0), ("EVICT", 2), ("CMERGE", 2), ("RAGGED", 1),
                ("FLAT", 1), ("SPANS", 1), ("OV", 0))),
    ("by_keys=0", (("BY_KEYS", 0),)),
])
def test_a_decode_shape_parses_named_and_positional_forms(text, given):
    spec = parse_decode_config(text)
    assert spec.given == given and str(spec) == ",".join(f"{k}={v}" for k, v in given)


@pytest.mark.parametrize("text, words", [
    ("NWARPS=6", "NWARPS=6 must be a multiple of 4 from 4 to 16"),
    ("BN=24", "BN=24 must be a multiple of 16"),
    ("STAGES=1", "STAGES=1 must be from 2 to 8"),
    ("SPLITS=-1", "SPLITS=-1 must be from 0 to 4096"),
    ("TMA=1", "unknown field 'TMA' (fields: NWARPS, BN, STAGES, MINB, SPLITS, BLOCKS_PER_SM, MIN_PER_SPLIT, MERGE, "
              "BY_KEYS, ONE_PER_SM, CLASSES, BN_SHORT, PDL, CLUSTER, CLUSTER_TILES, CLUSTER_ROWS, BY_PAIRS, HEADS, WG, "
              "KWG, EVICT, CMERGE, RAGGED, FLAT, SPANS, OV)"),
    ("WG=2", "WG=2 must be 0 or 1"),
    ("FLAT=3", "FLAT=3 must be from 0 to 2"),
    ("CLUSTER=17", "CLUSTER=17 must be from 0 to 16"),
    ("CLUSTER_ROWS=0", "CLUSTER_ROWS=0 must be from 1 to 4096"),
    ("PDL=2", "PDL=2 must be 0 or 1"),
    ("BY_KEYS=3", "BY_KEYS=3 must be from 0 to 2"),
    ("SPLITS=4,SPLITS=8", "SPLITS given twice"),
    ("HEADS=17", "HEADS=17 must be from 0 to 16"),
    ("CMERGE=3", "CMERGE=3 must be from 0 to 2"),
    ("RAGGED=2", "RAGGED=2 must be 0 or 1"),
])
def test_bad_decode_shapes_name_the_option_and_the_limit(text, words):
    with pytest.raises(BadInput) as e:
        parse_decode_config(text)
    assert str(e.value).startswith(f"--decode-config {text!r}: ") and words in str(e.value)


def test_the_splits_come_from_the_shape():
    # about 4 blocks per SM, at least 4 tiles a split (B=8 x H_kv=8 lists of 512 tiles on 132 SMs)
    four = parse_decode_config("BLOCKS_PER_SM=4").apply()
    assert split_count(512, 64, 132, four) == (63, 9)
    assert split_count(512, 64, 132, parse_decode_config("SPLITS=4").apply()) == (128, 4)
    assert split_count(512, 64, 132, parse_decode_config("BLOCKS_PER_SM=2").apply()) == (125, 5)
    assert split_count(16, 1, 132, parse_decode_config("SPLITS=64").apply()) == (1, 16)  # no empty splits
    assert split_count(512, 1, 132, four) == (4, 128)  # B = H_kv = 1: MIN_PER_SPLIT tiles a split
    # BLOCKS_PER_SM=0: one wave of what an SM holds (2 blocks of 112 KiB): 4 splits x 64 lists = 256 <= 264
    one_wave = parse_decode_config("BLOCKS_PER_SM=0").apply()
    assert split_count(512, 64, 132, one_wave, resident=2) == (128, 4)
    # B=1 at Tk=131072: 8 lists, 16 SMs each: one block per SM (ONE_PER_SM=8), else the wave's 264 blocks
    assert split_count(2048, 8, 132, one_wave, resident=2) == (128, 16)
    assert split_count(2048, 8, 132, replace(one_wave, ONE_PER_SM=0), resident=2) == (63, 33)
    assert split_count(2048, 8, 132, replace(one_wave, ONE_PER_SM=17), resident=2) == (63, 33)
    assert split_count(64, 512, 132, one_wave, resident=2) == (64, 1)  # more lists than a wave holds
    assert split_count(8, 1, 132, one_wave, resident=2) == (4, 2)  # MIN_PER_SPLIT tiles a split at least
    assert split_count(2048, 8, 132, resident=2) == (128, 16)  # the default shape


def test_a_ragged_batch_gives_its_long_lists_more_splits():
    # the decode configuration's ragged batch at Tq=1 (dense, 64-key tiles), 8 key/value heads, two blocks an SM
    seq = [-(-n // 64) for n in (29120, 23872, 20736, 14784, 15744, 9152, 9984, 8576)]
    pairs = np.repeat(seq, 8)
    # from the longest alone: 4 splits of 114 tiles, 184 blocks holding tiles of 264 places
    assert split_count(455, 64, 132, replace(DEFAULT, RAGGED=0), 2, pairs) == (114, 4)
    # from every list: 6 splits of 76 tiles for the longest, 2 for the shortest, 248 blocks with tiles; 7 would
    # need 280
    per, splits = split_count(455, 64, 132, DEFAULT, 2, pairs)
    assert (per, splits) == (76, 6)
    assert int((-(-pairs // per)).sum()) == 248
    assert int((-(-pairs // -(-455 // 7))).sum()) == 280
    assert ragged_splits(pairs, 455, 264, 4, 114) == 6
    # lists of one length: the same splits either way (the uniform rule's one wave is already exact)
    same = np.full(64, 512)
    assert split_count(512, 64, 132, DEFAULT, 2, same) == split_count(512, 64, 132, replace(DEFAULT, RAGGED=0), 2)
    # SPLITS given wins; and no more splits than MIN_PER_SPLIT tiles each allow
    assert split_count(455, 64, 132, replace(DEFAULT, SPLITS=3), 2, pairs) == (152, 3)
    assert ragged_splits([8, 1], 8, 1000, 1, 2) == 2


def test_a_flat_walk_cuts_the_lists_end_to_end_into_equal_runs():
    # the decode configuration's ragged batch at Tq=1 (dense, 64-key tiles), 8 key/value heads, one wave of 264
    seq = [-(-n // 64) for n in (29120, 23872, 20736, 14784, 15744, 9152, 9984, 8576)]
    firsts = np.concatenate([[0], np.cumsum(seq)[:-1]])
    pairs, pair_firsts = np.repeat(seq, 8), np.repeat(firsts, 8)  # a sequence's groups share its list
    st = flat_stretches(pairs, pair_firsts, 264, 4)
    total = int(pairs.sum())
    per = -(-total // 264)
    assert st.blocks == -(-total // per) <= 264
    segs = st.segs.astype(np.int64)
    runs = [segs[st.seg_at[x]:st.seg_at[x + 1]] for x in range(st.blocks)]
    assert all(int(r[:, 3].sum()) == per for r in runs[:-1]) and 0 < int(runs[-1][:, 3].sum()) <= per
    # every pair's tiles once, in order, its stretches in slots 0, 1, ... of its own
    for p in range(len(pairs)):
        mine = segs[segs[:, 0] == p]
        assert int(mine[:, 3].sum()) == pairs[p]
        assert list(mine[:, 1]) == [p * st.slots + i for i in range(len(mine))]
        starts = mine[:, 2] - pair_firsts[p]
        assert list(starts) == [0] + list(np.cumsum(mine[:, 3])[:-1])
    assert st.slots == max(int((segs[:, 0] == p).sum()) for p in range(len(pairs)))
    # a run crosses into the next pair: some block holds stretches of two pairs
    assert max(len(r) for r in runs) >= 2 and (segs[:, 3] > 0).all()
    # pairs of no tiles take no stretch; a run is at least `least` tiles
    st = flat_stretches([3, 0, 5], [0, 3, 3], 100, 4)
    assert st.segs.tolist() == [[0, 0, 0, 3], [2, 4, 3, 1], [2, 5, 4, 4]] and st.seg_at.tolist() == [0, 2, 3]
    assert st.slots == 2


def test_a_shape_the_kernel_cannot_take_is_refused_by_name(monkeypatch):
    assert DEFAULT.problem(64) is None and DEFAULT.problem(128) is None
    assert "loads 32 rows a pass" in DecodeConfig(NWARPS=8, BN=16).problem(64)
    assert "shared memory" in DecodeConfig(BN=256, STAGES=8).problem(128)
    m = make_mask("dense", 4096, True)
    v = IMPL.decode_variant(parse_decode_config("NWARPS=8,BN=16"))
    assert "loads" in v.unsupported(Problem(m, 1, 8, 64, "bfloat16", H_kv=2, Tq=1))
    # eight warps hold 128 rows: H/H_kv x Tq up to 128
    v = IMPL.decode_variant(parse_decode_config("NWARPS=8"))
    assert v.unsupported(Problem(m, 1, 32, 128, "bfloat16", H_kv=2, Tq=8)) is None
    assert "exceed 64" in IMPL.unsupported(Problem(m, 1, 32, 128, "bfloat16", H_kv=2, Tq=8))


def test_the_key_slices_kernel_takes_groups_of_up_to_16_rows():
    """BY_KEYS=2 (the default) runs kernels/decode_keys.cu where a group's rows fit one m16 tile and
    the shape cuts each tile into 16 or 32 keys a warp; BY_KEYS=1 refuses more rows by name."""
    assert DEFAULT.by_keys(4, 128) and DEFAULT.by_keys(16, 64) and not DEFAULT.by_keys(17, 128)
    assert not DecodeConfig(BY_KEYS=0).by_keys(4, 128)
    assert not DecodeConfig(BN=32).by_keys(4, 128)  # 8 keys a warp: the rows kernel
    assert not DecodeConfig(MERGE=1).by_keys(4, 128)  # the merge in the last split is decode.cu's
    assert "16 or 32 keys each" in DecodeConfig(BN=32, BY_KEYS=1).problem(128, keys=True)
    assert "MERGE=1" in DecodeConfig(MERGE=1, BY_KEYS=1).problem(128, keys=True)
    assert DecodeConfig(BN=128).by_keys(4, 128)  # 32 keys a warp
    # Q's 16 rows, not 64: (16 + 2 x 3 x 64) x 128 x 2 bytes
    assert DEFAULT.smem_bytes(128, keys=True) == 102400 and DEFAULT.smem_bytes(128) == 114688
    m = make_mask("dense", 4096, True)
    v = IMPL.decode_variant(parse_decode_config("BY_KEYS=1"))
    assert v.unsupported(Problem(m, 1, 32, 128, "bfloat16", H_kv=8, Tq=4)) is None  # 16 rows
    why = v.unsupported(Problem(m, 1, 32, 128, "bfloat16", H_kv=8, Tq=5))
    assert "20 query rows" in why and "exceed 16" in why and "BY_KEYS=1" in why


def test_a_variant_is_named_by_its_shape_and_the_plain_one_reads_the_environment(monkeypatch):
    v = IMPL.decode_variant(parse_decode_config("SPLITS=8,STAGES=2"))
    assert v.name == "fast-decode[STAGES=2,SPLITS=8]" and IMPL.name == "fast-decode" and IMPL.config is None
    assert v.shape() == DecodeConfig(STAGES=2, SPLITS=8)
    monkeypatch.delenv(ENV, raising=False)
    assert IMPL.shape() == DEFAULT
    monkeypatch.setenv(ENV, "BN=32,STAGES=4")
    assert IMPL.shape() == DecodeConfig(BN=32, STAGES=4) and v.shape() == DecodeConfig(STAGES=2, SPLITS=8)
    monkeypatch.setenv(ENV, "BN=7")
    with pytest.raises(BadInput, match=f"{ENV} 'BN=7': BN=7 must be a multiple of 16"):
        IMPL.shape()
    assert ENV in IMPL.description and "--decode-config" in IMPL.description


def test_the_sweep_adds_a_row_per_decode_shape(registry):
    from attnbench import sweep as sw

    registry["fast-decode"] = IMPL
    specs = [parse_decode_config(t) for t in ("SPLITS=8", "STAGES=2")]
    names = [i.name for i in sw.select_impls(("fake-exact", "fast-decode"), decode_configs=specs)]
    assert names == ["fake-exact", "fast-decode", "fast-decode[SPLITS=8]", "fast-decode[STAGES=2]"]
    why = r"--decode-config: none of the implementations \(fake-exact\) takes a decode shape \(fast-decode does\)"
    with pytest.raises(BadInput, match=why):
        sw.select_impls(("fake-exact",), decode_configs=specs)


def test_a_bad_decode_config_is_refused_before_any_device(registry, monkeypatch):
    from click.testing import CliRunner

    from attnbench import sweep as sw
    from attnbench.cli import main

    monkeypatch.setattr(sw, "device_context", lambda *a, **k: (_ for _ in ()).throw(AssertionError("device asked")))
    r = CliRunner().invoke(main, ["sweep", "--config", "decode", "--impl", "fake-exact", "--decode-config", "BN=7"])
    assert r.exit_code == 2 and "--decode-config 'BN=7': BN=7 must be a multiple of 16" in r.output


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("text", GPU_CHECK_SHAPES)
def test_the_shapes_the_gpu_check_tries_compile_without_spills(arch, text):
    cfg = parse_decode_config(text).apply()
    keys = cfg.by_keys(32 // 8 * 1, 128)  # the step's cases: Tq=1 against groups of 4 query heads
    assert cfg.problem(128, keys) is None
    for pattern in ("dense", "streaming"):
        mask = make_mask(pattern, 4096, True)
        reports = compile_only(KEYS_KERNEL if keys else KERNEL, kernel_defines(128, "bfloat16", mask, cfg, keys), arch)
        for r in reports:
            assert 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), (text, keys, r)


@pytest.mark.gpu
@pytest.mark.parametrize("text", ("SPLITS=1", "SPLITS=16", "BLOCKS_PER_SM=0", "BN=32,STAGES=4", "BN=128,STAGES=2",
                                  "NWARPS=8", "MERGE=1", "SPLITS=16,MERGE=1", "NWARPS=8,SPLITS=7,MERGE=1",
                                  "SPLITS=3,CLUSTER=8,BY_KEYS=0", "SPLITS=8,CLUSTER=8", "SPLITS=2,CLUSTER=2,BN=32",
                                  "WG=0", "WG=0,SPLITS=16", "WG=0,BY_KEYS=0,SPLITS=3", "BN=16,STAGES=2", "EVICT=1",
                                  "EVICT=1,BY_KEYS=0,SPLITS=3", "EVICT=1,NWARPS=8,KWG=2,BN=128"))
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("streaming", {"sink": 4, "window": 64})])
def test_gate_of_other_shapes(text, pattern, params):
    from attnbench.check import gate

    impl = IMPL.decode_variant(parse_decode_config(text))
    mask = make_mask(pattern, 4096, True, **params)
    for prob in (Problem(mask, 2, 32, 128, "bfloat16", H_kv=8, Tq=1),
                 Problem(mask, 2, 8, 64, "float16", H_kv=2, Tq=16),
                 Problem(mask, 3, 8, 128, "bfloat16", H_kv=2, Tq=4, cache_lens=(4096, 1024, 3008))):
        res = gate(impl, prob)
        assert res.ok, (text, prob.q_len, res)


@pytest.mark.gpu
@pytest.mark.parametrize("text", ("BY_KEYS=1", "BY_KEYS=1,SPLITS=1", "BY_KEYS=1,SPLITS=16", "BY_KEYS=1,BN=128,STAGES=2",
                                  "BY_KEYS=1,STAGES=2,MINB=3", "BY_KEYS=1,STAGES=4", "BY_KEYS=1,NWARPS=8,BN=128",
                                  "BY_KEYS=0,SPLITS=1", "BY_KEYS=1,SPLITS=5,CLUSTER=8", "BY_KEYS=1,EVICT=1"))
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("streaming", {"sink": 4, "window": 64}),
                                            ("window", {"window": 100}), ("dilated", {"window": 512, "dilation": 2})])
def test_gate_of_the_key_slices_kernel(text, pattern, params):
    """kernels/decode_keys.cu (and a single split, which stores the output without a merge launch) on
    groups of 4, 8 and 16 rows, ragged, both dtypes and head dims, where the shape takes the case."""
    from attnbench.check import gate

    impl = IMPL.decode_variant(parse_decode_config(text))
    mask = make_mask(pattern, 4096, True, **params)
    ran = 0
    for prob in (Problem(mask, 2, 32, 128, "bfloat16", H_kv=8, Tq=1),
                 Problem(mask, 2, 8, 64, "float16", H_kv=2, Tq=1),
                 Problem(mask, 2, 16, 64, "bfloat16", H_kv=4, Tq=4),
                 Problem(mask, 3, 8, 128, "bfloat16", H_kv=2, Tq=4, cache_lens=(4096, 1000, 3008))):
        if impl.unsupported(prob):
            continue
        res = gate(impl, prob)
        assert res.ok, (text, prob.q_len, res)
        ran += 1
    assert ran >= 2


@pytest.mark.gpu
def test_blocks_per_sm_0_takes_the_devices_occupancy():
    import cupy

    from attnbench.arrays import random_inputs

    impl = IMPL.decode_variant(parse_decode_config("BLOCKS_PER_SM=0"))
    prob = Problem(make_mask("dense", 32768, True), 8, 32, 128, "bfloat16", H_kv=8, Tq=1)
    q = random_inputs(prob.shape, prob.dtype, 1)[0]
    _, k, v = random_inputs(prob.kv_shape, prob.dtype, 2)
    setup = impl.prepare(prob, q, k, v).setup
    assert 1 <= setup["blocks_per_sm"] <= 4  # 100 KiB of shared memory a block at D=128: 2 on an H100 or H200
    assert "BN=64,STAGES=3," in setup["decode_config"]  # a long list: 64-key tiles
    assert "BLOCKS_PER_SM=0,MIN_PER_SPLIT=4,MERGE=0,BY_KEYS=2,ONE_PER_SM=8" in setup["decode_config"]
    assert setup["kernel"] == "decode_keys"  # 4 rows a group
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    assert 8 * 8 * setup["splits"] <= setup["blocks_per_sm"] * sms  # one wave


def _bytes_run_after_run(runner, runs: int = 3) -> list:
    """The output's bytes after each of ``runs`` runs, poisoned before each (every run writes every element)."""
    import cupy

    got = []
    for _ in range(runs):
        runner.poison()
        runner.run()
        got.append(cupy.asnumpy(runner.out).view(np.uint16))
    return got


def _all_equal(base: list, other: list) -> None:
    """Every run of ``other`` and every later run of ``base`` equals ``base``'s first, byte for byte."""
    for o in other + base[1:]:
        assert np.array_equal(o, base[0])


@pytest.mark.gpu
@pytest.mark.parametrize("Tq,splits", [(1, 16), (16, 5), (4, 1)])
def test_the_merge_in_the_last_split_matches_the_merge_launch_run_after_run(Tq, splits):
    """MERGE=1 (the last split of each pair merges, its ticket put back for the next launch) gives
    the bytes MERGE=0's second launch gives, on every one of several runs."""
    from attnbench.arrays import random_inputs

    prob = Problem(make_mask("streaming", 4096, True, sink=4, window=300), 3, 8, 128, "bfloat16", H_kv=2, Tq=Tq)
    q = random_inputs(prob.shape, prob.dtype, 3)[0]
    _, k, v = random_inputs(prob.kv_shape, prob.dtype, 4)
    outs = {}
    for merge in (0, 1):
        impl = IMPL.decode_variant(parse_decode_config(f"SPLITS={splits},MERGE={merge},BY_KEYS=0"))
        outs[merge] = _bytes_run_after_run(impl.prepare(prob, q, k, v))
    _all_equal(outs[0], outs[1])


@pytest.mark.gpu
@pytest.mark.parametrize("by_keys,Tq", [(2, 1), (0, 16)])
def test_the_merge_as_a_programmatic_dependent_matches_the_plain_launch_run_after_run(by_keys, Tq):
    """PDL=1 (the merge launch placed while the splits run, waiting for them) gives the bytes PDL=0's
    plain launch gives, run after run, on both split kernels; on sm_90 and later it runs so."""
    import cupy

    from attnbench.arrays import random_inputs
    from attnbench.launch import pdl_available

    prob = Problem(make_mask("window", 8192, True, window=3000), 2, 8, 128, "bfloat16", H_kv=2, Tq=Tq)
    q = random_inputs(prob.shape, prob.dtype, 5)[0]
    _, k, v = random_inputs(prob.kv_shape, prob.dtype, 6)
    outs = {}
    for pdl in (0, 1):
        runner = IMPL.decode_variant(parse_decode_config(f"SPLITS=12,BY_KEYS={by_keys},PDL={pdl}")).prepare(
            prob, q, k, v)
        assert runner.setup["splits"] == 12
        assert runner.setup["pdl"] == (pdl == 1 and pdl_available())
        outs[pdl] = _bytes_run_after_run(runner)
    if int(cupy.cuda.Device().compute_capability) >= 90:
        assert pdl_available()
    _all_equal(outs[0], outs[1])


# ---- CLUSTER: the splits of a pair merge in their thread-block cluster ---------------------------------
@pytest.mark.parametrize("splits, longest, cfg, cc, want", [
    (4, 16, dict(CLUSTER=8), 90, 4),
    (8, 500, dict(CLUSTER=8), 90, 8),
    (16, 64, dict(CLUSTER=8, CLUSTER_TILES=8), 90, 8),  # more splits derived, a list of at most 8 x 8 tiles: 8
    (16, 65, dict(CLUSTER=8, CLUSTER_TILES=8), 90, 1),  # a longer list keeps its splits and the merge launch
    (16, 72, dict(CLUSTER=8), 90, 8),    # the default's 9 tiles a split
    (16, 73, dict(CLUSTER=8), 90, 1),
    (16, 96, dict(CLUSTER=8, CLUSTER_TILES=12), 90, 8),
    (9, 9, dict(CLUSTER=8, SPLITS=9), 90, 1),  # splits given beyond a cluster: the merge launch
    (1, 4, dict(CLUSTER=8), 90, 1),      # one split stores the output itself
    (4, 16, dict(CLUSTER=8), 80, 1),     # no clusters before sm_90
    (4, 16, dict(CLUSTER=0), 90, 1),
    (4, 16, dict(CLUSTER=3), 90, 3),
    (4, 100, dict(CLUSTER=3), 90, 1),
    (4, 16, dict(CLUSTER=8, MERGE=1), 90, 1),
    (13, 65, dict(), 90, 9),   # the default: window 4096 at B=1, Tq=16 takes 9 splits of at most 8 tiles, not 8 of 9
    (9, 34, dict(), 90, 9),    # streaming 4+1024 at B=1, Tq=16: 9 splits of at most 4 tiles (a cluster of 9)
    (16, 81, dict(), 90, 9),   # 9 x CLUSTER_TILES
    (16, 82, dict(), 90, 1),
    (16, 64, dict(), 90, 8),   # 9 splits of 8 tiles would leave the ninth none: 8 of 8 (window 4096 at Tk=4096)
    (16, 56, dict(), 90, 8),   # 7 tiles a split either way
    (16, 63, dict(), 90, 9),
])
def test_the_cluster_is_the_pairs_splits_where_they_fit_one(splits, longest, cfg, cc, want):
    from attnbench.decode_config import DEFAULT, cluster_size

    assert cluster_size(splits, longest, 4, replace(DEFAULT, **cfg), cc) == want
    rows = DEFAULT.CLUSTER_ROWS
    assert cluster_size(splits, longest, rows, replace(DEFAULT, **cfg), cc) == want
    assert cluster_size(splits, longest, rows + 1, replace(DEFAULT, **cfg), cc) == 1  # many rows: the launch


def test_a_short_list_tries_smaller_clusters_and_a_long_one_its_own_only():
    from attnbench.decode_config import DEFAULT, cluster_tries

    assert cluster_tries(1, 10, DEFAULT) == []
    assert cluster_tries(4, 16, DEFAULT) == [4, 3, 2]
    assert cluster_tries(8, 64, DEFAULT) == [8, 7, 6, 5, 4, 3, 2]
    assert cluster_tries(4, 512, DEFAULT) == [4]  # dense at 32768 keys: its splits or the merge launch
    assert cluster_tries(4, 16, replace(DEFAULT, SPLITS=4)) == [4]  # splits asked for are kept


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("cluster", [2, 3, 8, 16])
def test_the_cluster_builds_compile_for_sm_90_without_spills(keys, D, cluster):
    mask = make_mask("streaming", 4096, True)
    cfg = replace(DEFAULT_CFG, BN=64 if keys else 32)
    defines = kernel_defines(D, "bfloat16", mask, cfg, keys, cluster=cluster)
    assert defines["CLUSTER"] == cluster
    reports = compile_only(KEYS_KERNEL if keys else KERNEL, defines, "sm_90")
    for r in reports:
        assert 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), r
    assert "CLUSTER" not in kernel_defines(D, "bfloat16", mask, cfg, keys)  # the standard builds hold none


@pytest.mark.parametrize("keys,cluster,kwg", [(False, 2, 2), (False, 8, 1), (True, 2, 1), (True, 3, 1)])
def test_the_gathered_cluster_merge_reads_every_piece_before_its_first_store(keys, cluster, kwg):
    """CMERGE=1: a thread's reads through the cluster window (each piece's CLUSTER log-sum-exps and float4s) all
    come before its first output store, where the merge piece by piece (CMERGE=0) stores each piece before the
    next one's reads; both build for sm_90 (sm_90a: the warpgroup build) without spills."""
    import re

    from attnbench.compile import ptx

    mask = make_mask("streaming", 4096, True)
    cfg = replace(DEFAULT_CFG, NWARPS=8, KWG=2) if kwg > 1 else replace(DEFAULT_CFG, BN=64 if keys else 32)
    arch = "sm_90" if keys else "sm_90a"
    threads, rows = 32 * cfg.NWARPS, 16 if keys else 64  # the partial's rows a split: decode_keys' m16, else BM
    turns = -(-rows * 128 // 4 // (cluster * threads))  # a thread's four-column pieces, at most
    reads = {}
    for cm in (0, 1):
        defines = kernel_defines(128, "bfloat16", mask, replace(cfg, CMERGE=cm), keys, cluster=cluster,
                                 wg=not keys)
        assert defines.get("CMERGE", 0) == cm
        for r in compile_only(KEYS_KERNEL if keys else KERNEL, defines, arch):
            assert 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), r
        text = ptx(KEYS_KERNEL if keys else KERNEL, defines, arch)
        merge = text[text.index("barrier.cluster.wait"):]  # from the first cluster barrier's wait on
        reads[cm] = len(re.findall(r"ld\.shared::cluster", merge[:merge.index("st.global")]))
    assert reads[0] == 2 * cluster and reads[1] == 2 * cluster * turns, (reads, turns)
    assert turns > 1  # (each case has more than one piece a thread, so the two differ)
    assert "CMERGE" not in kernel_defines(128, "bfloat16", mask, replace(DEFAULT_CFG, CMERGE=1), keys)  # no cluster


@pytest.mark.gpu
@pytest.mark.parametrize("by_keys,Tq,splits", [(2, 1, 4), (2, 1, 8), (0, 4, 3), (0, 1, 2), (2, 1, 16), (0, 16, 8),
                                                (0, 16, 16)])
def test_the_clusters_merge_matches_the_merge_launch_run_after_run(by_keys, Tq, splits):
    """CLUSTER=16 (the splits, up to 16 here, merge through distributed shared memory in their cluster, no
    merge launch) gives the bytes of the merge launch, run after run, ragged batch included, on both split
    kernels, up to 64 rows a pair (CLUSTER_ROWS=64, Tq=16 against 4 query heads a key/value head); so does
    the cluster's merge with every piece's reads gathered (CMERGE=1)."""
    import cupy

    from attnbench.arrays import random_inputs

    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("clusters: sm_90 and later")
    prob = Problem(make_mask("window", 8192, True, window=3000), 3, 8, 128, "bfloat16", H_kv=2, Tq=Tq,
                   cache_lens=(8192, 2000, 5000))
    q = random_inputs(prob.shape, prob.dtype, 7)[0]
    _, k, v = random_inputs(prob.kv_shape, prob.dtype, 8)
    outs = {}
    for cluster, cmerge in ((0, 0), (16, 0), (16, 1)):
        spec = parse_decode_config(f"SPLITS={splits},BY_KEYS={by_keys},CLUSTER={cluster},CLUSTER_ROWS=64,"
                                   f"CMERGE={cmerge}")
        runner = IMPL.decode_variant(spec).prepare(prob, q, k, v)
        assert runner.setup["cluster"] == (splits if cluster else 1), runner.setup
        assert runner.setup["splits"] == splits
        outs[cluster, cmerge] = _bytes_run_after_run(runner)
    _all_equal(outs[0, 0], outs[16, 0])
    _all_equal(outs[0, 0], outs[16, 1])  # CMERGE=1: the cluster's merge gathered, the same sums, the same bytes


# ---- CLASSES=1: a strided pattern's one query reads its residue class only ---------------------------
@pytest.mark.parametrize("T", [1, 2, 3, 100, 4096, 4097])
@pytest.mark.parametrize("params", [dict(window=512, dilation=2), dict(window=7, dilation=3)])
def test_a_querys_residue_class_holds_every_key_it_reads(T, params):
    """The kernel with STRIDE = r reads the keys c, c + r, ... (c = (T - 1) % r) up to T - 1 as the class's
    positions 0 .. (T - 1) // r, by the inner pattern's list at that class length: mapped back, the
    keys that list's last position allows are exactly the pattern's keys of position T - 1."""
    from attnbench.decode import class_len

    m = make_mask("dilated", T, True, **params)
    r, inner = m.strided()
    c, L = (T - 1) % r, class_len(T, r)
    assert L == len(range(c, T, r))  # the class's keys up to T - 1
    keys = inner.at(L).keys(np.array([L - 1]))
    assert np.array_equal(c + r * keys, m.keys(np.array([T - 1])))
    lst = decode_list(inner.at(L), 1)
    assert set(lst.entries >> 1) == set(keys // BN)  # the tiles of those class positions, and no others


# ---- BN_SHORT: short lists in 32-key tiles ------------------------------------------------------------
def test_short_lists_take_short_tiles_and_long_ones_keep_64():
    """for_list: BN_SHORT where BN is the default's and the list holds at most SHORT_LIST_KEYS keys; a BN
    given, or BN_SHORT=0, keeps the tiles as given; plan_lists builds the lists in the tiles it runs."""
    from attnbench.decode_config import DEFAULT, LONG_BN, SHORT_LIST_KEYS
    from attnbench.decode import plan_lists

    assert DEFAULT.BN == LONG_BN == 64 and DEFAULT.BN_SHORT == 32
    assert DEFAULT.for_list(SHORT_LIST_KEYS, 4, 128).BN == 32 and DEFAULT.for_list(SHORT_LIST_KEYS + 64, 4, 128).BN == 64
    assert DEFAULT.for_list(64, 64, 64).BN == 32  # Tq=16 against 4 heads: the rows kernel at 32-key tiles
    assert replace(DEFAULT, BN_SHORT=0).for_list(64, 4, 128).BN == 64
    assert replace(DEFAULT, BN=128).for_list(64, 4, 128).BN == 128  # a BN given is kept
    # where the short shape does not run, the long one stays: the key slices of BY_KEYS=1 need 64 keys
    # among 4 warps, and 16 warps load 64 rows a pass
    assert replace(DEFAULT, BY_KEYS=1).for_list(64, 4, 128).BN == 64
    assert replace(DEFAULT, NWARPS=16).for_list(64, 4, 64).BN == 64
    # the rows kernel on warpgroup MMA (sm_90) where the pairs outnumber the SMs: 32-key tiles up to WG_SHORT_LIST_KEYS
    from attnbench.decode_config import WG_SHORT_LIST_KEYS

    assert DEFAULT.for_list(WG_SHORT_LIST_KEYS + 64, 64, 128, "90", many_pairs=True).BN == 64
    assert DEFAULT.for_list(WG_SHORT_LIST_KEYS, 64, 128, "90", many_pairs=True).BN == 32
    assert DEFAULT.for_list(WG_SHORT_LIST_KEYS + 64, 64, 128, "90").BN == 32  # few pairs: the split chains
    # 4 rows (Tq=1): 64-key tiles would take the key slices, on mma.sync; the short tiles stay (H200, B=64: the key
    # slices 1.02-1.08x slower on bigbird, dilated and streaming 4+1024)
    assert DEFAULT.for_list(WG_SHORT_LIST_KEYS + 64, 4, 128, "90", many_pairs=True).BN == 32
    assert DEFAULT.for_list(WG_SHORT_LIST_KEYS + 64, 64, 128, "80", many_pairs=True).BN == 32  # mma.sync
    assert replace(DEFAULT, WG=0).for_list(WG_SHORT_LIST_KEYS + 64, 64, 128, "90", many_pairs=True).BN == 32
    prob = Problem(make_mask("streaming", 32768, True, sink=4, window=1024), 64, 32, 128, "bfloat16", H_kv=8, Tq=16)
    assert plan_lists(prob, DEFAULT, [prob.T], None, "90", 132)[0].BN == 64  # 512 pairs on 132 SMs
    assert plan_lists(prob, replace(DEFAULT, KWG=1), [prob.T], None, "90", 1024)[0].BN == 32
    # (where the pairs are neither few nor many, the default puts two warpgroups on the rows, on 64-key tiles)
    two = plan_lists(prob, DEFAULT, [prob.T], None, "90", 1024)[0]
    assert (two.KWG, two.NWARPS, two.BN) == (2, 8, 64), two.spec
    cases = {"streaming": (dict(sink=16, window=64), 32), "window": (dict(window=4096), 64),
             "dense": ({}, 64), "bigbird": ({}, 32)}
    for name, (params, bn) in cases.items():
        prob = Problem(make_mask(name, 32768, True, **params), 2, 32, 128, "bfloat16", H_kv=8, Tq=16)
        cfg, stride, mask, lists = plan_lists(prob, DEFAULT, [prob.T])
        assert cfg.BN == bn, name
        want = decode_list(prob.mask, 16, bn).entries
        assert stride == 1 and np.array_equal(lists[0].entries, want), name
    # dilated with one query: its residue class (2 apart), 512 class positions in 32-key tiles
    prob = Problem(make_mask("dilated", 32768, True, window=512, dilation=2), 2, 32, 128, "bfloat16", H_kv=8, Tq=1)
    cfg, stride, mask, lists = plan_lists(prob, DEFAULT, [prob.T])
    assert (cfg.BN, stride, lists[0].entries.size) == (32, 2, 16)


def test_classes_apply_to_a_strided_pattern_with_one_query_only():
    from attnbench.decode_config import DEFAULT
    from attnbench.decode import by_class

    on = replace(DEFAULT, CLASSES=1)
    dil = make_mask("dilated", 4096, True, window=512, dilation=2)
    one = Problem(dil, 2, 32, 128, "bfloat16", H_kv=8, Tq=1)
    r, inner = by_class(one, on)
    assert r == 2 and inner.label() == "window(window=512)"
    assert by_class(one, replace(DEFAULT, CLASSES=0)) is None  # every row of the tiles, masked
    assert by_class(Problem(dil, 2, 32, 128, "bfloat16", H_kv=8, Tq=16), on) is None  # both classes' queries
    assert by_class(Problem(make_mask("window", 4096, True, window=512), 2, 32, 128, "bfloat16", H_kv=8, Tq=1),
                    on) is None  # no stride
    ragged = Problem(dil, 3, 32, 128, "bfloat16", H_kv=8, Tq=1, cache_lens=(4096, 1001, 2050))
    assert by_class(ragged, on)[0] == 2  # each sequence its own class
    assert parse_decode_config("CLASSES=1").apply().CLASSES == 1
    with pytest.raises(BadInput, match="CLASSES=2"):
        parse_decode_config("CLASSES=2")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_the_class_builds_compile_without_spills(arch, keys, D):
    from attnbench.decode_config import DEFAULT

    m = make_mask("dilated", 4096, True, window=512, dilation=2)
    r, inner = m.strided()
    for rep in compile_only(KEYS_KERNEL if keys else KERNEL,
                            kernel_defines(D, "bfloat16", inner, replace(DEFAULT, CLASSES=1), keys, r), arch):
        assert 0 < rep.registers <= 255 and (rep.spill_stores, rep.spill_loads) == (0, 0), rep


@pytest.mark.gpu
@pytest.mark.parametrize("text", ["CLASSES=1", "CLASSES=1,BY_KEYS=0", "CLASSES=1,SPLITS=1", "CLASSES=1,SPLITS=16",
                                  "CLASSES=1,BN_SHORT=0"])
@pytest.mark.parametrize("params", [dict(window=512, dilation=2), dict(window=33, dilation=3)])
def test_gate_of_the_residue_class_decode(text, params):
    """CLASSES=1 on dilated decodes: one query a sequence, both kernels, one split and many, sequences of
    every residue (ragged), both head dims; Tq=16 falls back to every row (the classes' queries differ)."""
    from attnbench.check import gate

    impl = IMPL.decode_variant(parse_decode_config(text))
    mask = make_mask("dilated", 4096, True, **params)
    for prob in (Problem(mask, 2, 32, 128, "bfloat16", H_kv=8, Tq=1),
                 Problem(mask, 2, 8, 64, "float16", H_kv=2, Tq=1),
                 Problem(mask, 4, 32, 128, "bfloat16", H_kv=8, Tq=1, cache_lens=(4096, 1001, 2050, 3)),
                 Problem(mask, 2, 8, 64, "bfloat16", H_kv=2, Tq=16)):
        runner = impl.prepare(prob, *_gate_inputs(prob))
        assert runner.setup["classes"] == (params["dilation"] if prob.q_len == 1 else 1)
        res = gate(impl, prob)
        assert res.ok, (text, prob.q_len, res)


def _gate_inputs(prob):
    from attnbench.check import problem_inputs

    return problem_inputs(prob, 7)


# ---- BY_PAIRS: a warp a pair (kernels/decode_pairs.cu) ------------------------------------------------
def test_a_warp_takes_a_pair_where_the_shape_says_and_the_stages_fit():
    """pairs_take: BY_PAIRS 1 wherever a pair's rows fit one m16 tile and the warps' stages fit shared memory;
    2 only where the pairs also outnumber one wave of the split kernel's blocks; never with a split count or
    the last split's merge given."""
    short = replace(DEFAULT, BN=32)
    limit = 227 * 1024
    assert short.pairs_smem(128) == 4 * (16 + 2 * 3 * 32) * 128 * 2 == 208 * 1024
    one, two = replace(short, BY_PAIRS=1), replace(short, BY_PAIRS=2)
    assert not replace(short, BY_PAIRS=0).pairs_take(4, 512, 128, 264, limit)
    assert one.pairs_take(4, 16, 128, 264, limit) and one.pairs_take(16, 16, 64, 264, limit)
    assert not one.pairs_take(17, 512, 128, 264, limit)  # rows past one m16 tile
    assert not one.pairs_take(4, 512, 128, 264, 163 * 1024)  # 208 KiB of stages: not on an A100
    assert not replace(DEFAULT, BY_PAIRS=1).pairs_take(4, 512, 128, 264, limit)  # 64-key stages: 400 KiB
    assert not replace(one, SPLITS=4).pairs_take(4, 512, 128, 264, limit)
    assert not replace(one, MERGE=1).pairs_take(4, 512, 128, 264, limit)
    assert two.pairs_take(4, 512, 128, 264, limit) and not two.pairs_take(4, 264, 128, 264, limit)
    assert parse_decode_config("BY_PAIRS=2").apply().BY_PAIRS == 2
    with pytest.raises(BadInput, match="BY_PAIRS=3"):
        parse_decode_config("BY_PAIRS=3")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("pattern", ["dense", "streaming", "document", "custom"])
def test_the_pairs_kernel_compiles_without_spills(arch, D, pattern):
    from attnbench.decode import PAIRS_KERNEL

    mask = make_mask(pattern, 4096, True)
    reports = compile_only(PAIRS_KERNEL, kernel_defines(D, "bfloat16", mask, replace(DEFAULT, BN=32), pairs=True), arch)
    assert sorted(r.kernel for r in reports) == ["decode_merge", "decode_pairs"]
    for r in reports:
        assert 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), r
    assert "MERGE_LAST" not in kernel_defines(D, "bfloat16", mask, DEFAULT, pairs=True)


@pytest.mark.gpu
@pytest.mark.parametrize("text", ("BY_PAIRS=1", "BY_PAIRS=1,STAGES=2", "BY_PAIRS=1,BN_SHORT=16", "BY_PAIRS=1,NWARPS=8,STAGES=2",
                                  "BY_PAIRS=1,EVICT=1"))
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("streaming", {"sink": 16, "window": 64}),
                                            ("window", {"window": 100}), ("dilated", {"window": 512, "dilation": 2}),
                                            ("bigbird", {})])
def test_gate_of_the_pairs_kernel(text, pattern, params):
    """kernels/decode_pairs.cu on groups of 4 and 16 rows, both dtypes and head dims, key/value heads that leave
    a block's last warps idle (2 over 4 warps), ragged batches, a dilated query's residue class, and lists
    from a tile to 32 (T 1024: the short lists' tiles; T=4096 dense runs the split kernel, its 64-key stages
    too large; with NWARPS=8,STAGES=2 without a cluster, whose rows would not fit its shared memory)."""
    from attnbench.check import gate

    impl = IMPL.decode_variant(parse_decode_config(text))
    ran = 0
    for T in (1024, 4096):
        mask = make_mask(pattern, T, True, **params)
        for prob in (Problem(mask, 3, 32, 128, "bfloat16", H_kv=8, Tq=1),
                     Problem(mask, 2, 8, 64, "float16", H_kv=2, Tq=1),
                     Problem(mask, 2, 16, 64, "bfloat16", H_kv=4, Tq=4),
                     Problem(mask, 4, 8, 128, "bfloat16", H_kv=2, Tq=1, cache_lens=(T, 320, T // 2, T - 64))):
            if impl.unsupported(prob):
                continue
            runner = impl.prepare(prob, *_gate_inputs(prob))
            ran += runner.setup["kernel"] == "decode_pairs"
            res = gate(impl, prob)
            assert res.ok, (text, T, prob.q_len, res)
    assert ran >= 2  # 8 warps' stages at D=128 (288 KiB) do not fit: those cases run the split kernel


@pytest.mark.gpu
def test_the_default_takes_a_warp_a_pair_only_where_the_pairs_outnumber_a_wave():
    from attnbench.decode import PAIRS_KERNEL

    mask = make_mask("streaming", 4096, True, sink=16, window=64)
    kernels = {}
    for B in (8, 64):
        prob = Problem(mask, B, 32, 128, "bfloat16", H_kv=8, Tq=1)
        kernels[B] = IMPL.prepare(prob, *_gate_inputs(prob)).setup["kernel"]
    assert kernels == {8: KERNEL, 64: PAIRS_KERNEL} if DEFAULT.BY_PAIRS == 2 else kernels[64] != PAIRS_KERNEL


def test_a_cluster_is_asked_only_where_its_rows_fit_the_blocks_shared_memory():
    """The kernels' static assertion, on the host: the block's float32 rows (and, for the key slices, the warps'
    rows beside them) must fit the shared memory the block has, or the pair keeps the merge launch."""
    assert DEFAULT.cluster_rows_fit(128) and DEFAULT.cluster_rows_fit(128, keys=True)
    assert replace(DEFAULT, BN=32).cluster_rows_fit(128)  # 64 rows: 33 KiB of 64
    assert not replace(DEFAULT, NWARPS=8, BN=32, STAGES=2).cluster_rows_fit(128)  # 128 rows: 66048 bytes of 65536
    assert not replace(DEFAULT, BN=16, STAGES=2).cluster_rows_fit(64)
    assert replace(DEFAULT, BN=64, STAGES=2).cluster_rows_fit(128, keys=True)  # 5 warps' rows: 41024 bytes of 65536
    built = refused = 0
    for text in ("NWARPS=8,BN=32,STAGES=2", "BN=16,STAGES=2", "BN=64,STAGES=2"):
        cfg = parse_decode_config(text).apply()
        for D in (64, 128):
            for keys in (False, True):
                if cfg.problem(D, keys):
                    continue
                defines = kernel_defines(D, "bfloat16", make_mask("dense", 64, True), cfg, keys, cluster=2)
                name = KEYS_KERNEL if keys else KERNEL
                if cfg.cluster_rows_fit(D, keys):
                    compile_only(name, defines, "sm_90")
                    built += 1
                else:
                    with pytest.raises(Exception, match="the rows fit Q's tile and the stages"):
                        compile_only(name, defines, "sm_90")
                    refused += 1
    assert built >= 3 and refused >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("B, text", [(8, ""), (64, ""), (2, "SPLITS=1"), (2, "SPLITS=4,CLUSTER=0")])
def test_split_partials_are_allocated_only_where_a_merge_launch_reads_them(B, text):
    """A single split stores the output itself and a cluster merges in shared memory: neither allocates the
    float32 partials (the peak_mem_mb column counts what runs); the merge launch does."""
    import cupy

    impl = IMPL.decode_variant(parse_decode_config(text)) if text else IMPL
    prob = Problem(make_mask("streaming", 4096, True, sink=4, window=1024), B, 32, 128, "bfloat16", H_kv=8, Tq=1)
    inputs = _gate_inputs(prob)
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    runner = impl.prepare(prob, *inputs)
    extra = pool.used_bytes() - before - 2 * int(np.prod(prob.shape))  # beyond the output
    setup = runner.setup
    partials = B * 8 * setup["splits"] * 16 * (128 + 1) * 4
    if setup["splits"] == 1 or setup["cluster"] > 1:
        assert extra < 64 * 1024, setup
    else:
        assert extra >= partials, setup


# ---- WG: the rows kernel on warpgroup MMA (sm_90) -----------------------------------------------------------
def test_the_rows_kernel_takes_warpgroup_mma_on_sm_90_only():
    """wgmma: the rows kernel (not the key slices), WG 1, compute capability 9.0 itself (an sm_90a build runs
    nowhere else), tiles of 32, 64 or 128 keys; the key slices and a warp a pair have no such build."""
    assert DEFAULT.WG == 1 and DEFAULT.wgmma(False, "90") and DEFAULT.wgmma(False, 90)
    assert not DEFAULT.wgmma(True, "90")  # the key slices stay on mma.sync
    assert not DEFAULT.wgmma(False, "80") and not DEFAULT.wgmma(False, "100")
    assert not DecodeConfig(WG=0).wgmma(False, "90")
    assert not replace(DEFAULT, BN=16).wgmma(False, "90") and replace(DEFAULT, BN=128).wgmma(False, "90")
    m = make_mask("dense", 4096, True)
    d = kernel_defines(128, "bfloat16", m, wg=True)
    assert d["WG"] == 1 and d["LAZY"] == 0 and "WG" not in kernel_defines(128, "bfloat16", m)
    for keys, pairs in ((True, False), (False, True)):
        with pytest.raises(ValueError, match="rows kernel"):
            kernel_defines(128, "bfloat16", m, keys=keys, pairs=pairs, wg=True)
    assert parse_decode_config("WG=0").apply().WG == 0
    with pytest.raises(BadInput, match="WG"):
        parse_decode_config("WG=2")


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("pattern", ["dense", "streaming", "document", "custom"])
@pytest.mark.parametrize("cfg_text, cluster", [("", 1), ("", 8), ("BN=32", 1), ("NWARPS=8,MERGE=1", 1),
                                               ("NWARPS=8,KWG=2,BN=128", 8), ("NWARPS=8,KWG=2", 1),
                                               ("NWARPS=8,KWG=2,BN=128,MERGE=1", 1), ("OV=1", 9), ("OV=1,BN=32", 1),
                                               ("NWARPS=8,KWG=2,OV=1", 2), ("OV=1,STAGES=4", 1)])
def test_the_warpgroup_build_compiles_for_sm_90a_without_spills_or_serialised_products(D, pattern, cfg_text, cluster):
    """The rows kernel's WG build: no spills, and no warpgroup MMA that ptxas serialises (C7514 / C7515: a plain
    instruction touching its accumulators in flight), with a cluster's merge, short tiles and two warpgroups, on
    different rows or (KWG=2) on the same rows and different keys."""
    from attnbench import compile as kc

    cfg = parse_decode_config(cfg_text).apply() if cfg_text else DEFAULT
    defines = kernel_defines(D, "bfloat16", make_mask(pattern, 4096, True), cfg, cluster=cluster, wg=True)
    reports = compile_only(KERNEL, defines, "sm_90a")
    assert sorted(r.kernel for r in reports) == ["decode_merge", "decode_split"]
    for r in reports:
        assert r.arch == "sm_90a" and 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), r
    _, log = kc._nvrtc(KERNEL, kc.source(KERNEL, defines), list(kc.options(defines)) + ["-arch=sm_90a", "-Xptxas=-v"])
    assert "C7514" not in log and "C7515" not in log and "serialized" not in log, log


@pytest.mark.gpu
@pytest.mark.parametrize("text", ("", "WG=0"))
def test_the_rows_kernel_says_whether_it_ran_on_warpgroup_mma(text):
    """A group of 64 rows (4 heads x Tq=16) runs the rows kernel, on warpgroup MMA exactly on sm_90 with WG 1; a
    group of 4 rows (Tq=1) on a long list's 64-key tiles runs the key slices, never on it."""
    import cupy

    impl = IMPL.decode_variant(parse_decode_config(text)) if text else IMPL
    sm90 = cupy.cuda.Device().compute_capability == "90"
    mask = make_mask("window", 4096, True, window=4096)
    for tq, want in ((16, sm90 and not text), (1, False)):
        prob = Problem(mask, 2, 32, 128, "bfloat16", H_kv=8, Tq=tq)
        setup = impl.prepare(prob, *_gate_inputs(prob)).setup
        assert setup["wgmma"] == want and setup["kernel"] == (KERNEL if tq == 16 else KEYS_KERNEL), setup


# ---- EVICT: K and V under L2's evict-first policy ----------------------------------------------------------
def _copies(ptx: str) -> tuple[list[str], list[str]]:
    """A PTX's cp.async copies to shared memory: (those with an L2 cache hint, those without)."""
    copies = [ln for ln in ptx.splitlines() if "cp.async.cg.shared.global" in ln]
    return [ln for ln in copies if "cache_hint" in ln], [ln for ln in copies if "cache_hint" not in ln]


@pytest.mark.parametrize("kernel, kw, arch", [(KERNEL, {}, "sm_80"), (KERNEL, {}, "sm_90"),
                                              (KEYS_KERNEL, dict(keys=True), "sm_90"), ("decode_pairs", dict(pairs=True), "sm_80")])
def test_evict_first_loads_k_and_v_with_an_l2_policy_and_nothing_else(kernel, kw, arch):
    """EVICT=1 compiles KV_EVICT into the decode kernels on mma.sync: their K and V copies carry createpolicy's
    evict-first policy (cp.async with an L2 cache hint), Q's copies and the merge stay plain, and nothing spills;
    EVICT=0 and the default's 2 (not yet decided for a launch) have no cache hint anywhere, and neither has the
    forward, which shares the loader."""
    from attnbench import compile as kc
    from attnbench import fwd_config

    m = make_mask("window", 4096, True, window=1024)
    on = kernel_defines(128, "bfloat16", m, parse_decode_config("EVICT=1").apply(), **kw)
    off = kernel_defines(128, "bfloat16", m, DEFAULT, **kw)
    assert on["KV_EVICT"] == 1 and "KV_EVICT" not in off and DEFAULT.EVICT == 2  # (2: decided by the runner)
    ptx_on, ptx_off = kc.ptx(kernel, on, arch), kc.ptx(kernel, off, arch)
    hinted, plain = _copies(ptx_on)
    assert "createpolicy.fractional.L2::evict_first" in ptx_on and hinted and plain  # K and V hinted, Q plain
    assert "cache_hint" not in ptx_off and "createpolicy" not in ptx_off
    zero = kernel_defines(128, "bfloat16", m, parse_decode_config("EVICT=0").apply(), **kw)
    assert zero == off
    fwd = fwd_config.kernel_defines(128, "bfloat16", m)
    assert "cache_hint" not in kc.ptx("fast_tc", fwd, "sm_80")
    for r in compile_only(kernel, on, arch):
        assert (r.spill_stores, r.spill_loads) == (0, 0), r
    with pytest.raises(BadInput, match="EVICT"):
        parse_decode_config("EVICT=3")


@pytest.mark.parametrize("kwg", (1, 2))
def test_the_warpgroup_build_takes_evict_first_with_its_k_and_v_addresses_through_a_shuffle(kwg):
    """The rows kernel's warpgroup-MMA build (sm_90a) with EVICT=1: K and V copies hinted, Q's plain, no spill, and
    each hinted tile load's shared address passed through a warp shuffle (without it ptxas named the policy's
    descriptor by an odd uniform register, desc[UR5], and the build stopped with an illegal instruction); the
    plain build has neither hint nor that shuffle."""
    from attnbench import compile as kc

    m = make_mask("window", 4096, True, window=1024)
    text = "EVICT=1" + (",NWARPS=8,KWG=2,BN=128" if kwg == 2 else "")
    on = kernel_defines(128, "bfloat16", m, parse_decode_config(text).apply(), wg=True)
    off = kernel_defines(128, "bfloat16", m, parse_decode_config(text.replace("EVICT=1", "EVICT=0")).apply(), wg=True)
    assert on["KV_EVICT"] == 1 and on["WG"] == 1 and "KV_EVICT" not in off
    ptx_on, ptx_off = kc.ptx(KERNEL, on, "sm_90a"), kc.ptx(KERNEL, off, "sm_90a")
    hinted, plain = _copies(ptx_on)
    assert hinted and plain and "cache_hint" not in ptx_off
    shuffles = ptx_on.count("shfl.sync.idx.b32") - ptx_off.count("shfl.sync.idx.b32")
    assert shuffles > 0 and len(hinted) % shuffles == 0, (shuffles, len(hinted))  # a shuffle a hinted tile load
    for r in compile_only(KERNEL, on, "sm_90a"):
        assert (r.spill_stores, r.spill_loads) == (0, 0), r


def test_evict_is_decided_by_the_bytes_a_launch_reads_against_l2():
    """EVICT 2 (the default): evict-first where K and V weigh at most EVICT_L2 times L2 and each byte is read by one
    block; 0 and 1 as given."""
    from attnbench.decode_config import EVICT_L2

    l2 = 50 << 20
    assert DEFAULT.evict_for(EVICT_L2 * l2, l2).EVICT == 1 and DEFAULT.evict_for(EVICT_L2 * l2 + 1, l2).EVICT == 0
    assert DEFAULT.evict_for(1 << 20, l2, heads=4).EVICT == 0  # a group's other blocks read it again from L2
    for given in (0, 1):
        cfg = parse_decode_config(f"EVICT={given}").apply()
        assert cfg.evict_for(1 << 20, l2).EVICT == given and cfg.evict_for(1 << 40, l2).EVICT == given


def test_the_cluster_merge_is_gathered_where_a_thread_takes_more_than_one_piece():
    """CMERGE 2 (the default): gathered (1) where the pair's rows x D / 4 four-column pieces outnumber the cluster's
    threads, in turn (0) where each thread takes at most one or there is no cluster; 0 and 1 as given; only 1 adds
    the -D."""
    two = replace(DEFAULT, NWARPS=8, KWG=2)  # B=8, Tq=16: 64 rows, 256 threads, a cluster of 2
    assert two.cmerge_for(64, 2, 128).CMERGE == 1 and two.cmerge_for(64, 8, 128).CMERGE == 0  # 2048 / 512, / 2048
    assert DEFAULT.cmerge_for(64, 8, 128).CMERGE == 1  # B=1, Tq=16: 2048 pieces over 8 x 128 threads
    assert DEFAULT.cmerge_for(4, 8, 128).CMERGE == 0 and DEFAULT.cmerge_for(16, 4, 128).CMERGE == 0  # Tq=1
    assert DEFAULT.cmerge_for(64, 1, 128).CMERGE == 0  # no cluster: the merge launch
    assert DEFAULT.cmerge_for(16, 2, 64).CMERGE == 0 and DEFAULT.cmerge_for(17, 2, 64).CMERGE == 1  # 256 / 256, 272
    for given in (0, 1):
        cfg = parse_decode_config(f"CMERGE={given}").apply()
        assert cfg.cmerge_for(64, 2, 128).CMERGE == given and cfg.cmerge_for(4, 8, 128).CMERGE == given
    mask = make_mask("streaming", 4096, True)
    assert "CMERGE" not in kernel_defines(128, "bfloat16", mask, DEFAULT, cluster=8, wg=True)  # (2: undecided)
    assert kernel_defines(128, "bfloat16", mask, DEFAULT.cmerge_for(64, 8, 128), cluster=8, wg=True)["CMERGE"] == 1


@pytest.mark.gpu
def test_the_runner_gathers_the_cluster_merge_where_a_thread_takes_several_pieces():
    """The default runner's shape (its row's decode_config) at T=32768, window 4096: CMERGE=1 where 16 queries of 4
    heads (64 rows) merge in a cluster, 0 for one query (4 rows), on sm_90 where clusters run."""
    import cupy

    if int(cupy.cuda.Device().compute_capability) < 90:
        pytest.skip("clusters: sm_90 and later")
    for B, Tq, want in ((1, 16, 1), (8, 16, 1), (1, 1, 0)):
        prob = Problem(make_mask("window", 32768, True, window=4096), B, 32, 128, "bfloat16", H_kv=8, Tq=Tq)
        setup = IMPL.prepare(prob, *_gate_inputs(prob)).setup
        assert setup["cluster"] > 1 and f",CMERGE={want}" in setup["decode_config"], setup


@pytest.mark.gpu
def test_the_runner_loads_evict_first_where_a_launch_reads_little():
    """The default runner's shape (its row's decode_config): EVICT=1 for B=1, Tq=1 at T=4096 (17 MB of K and V), 0
    for dense at B=4, T=32768 (537 MB, past three L2s on any device here), and the byte count it went by."""
    import cupy

    l2 = cupy.cuda.Device().attributes["L2CacheSize"]
    for B, T, want in ((1, 4096, 1), (4, 32768, 0)):
        prob = Problem(make_mask("dense", T, True), B, 32, 128, "bfloat16", H_kv=8, Tq=1)
        setup = IMPL.prepare(prob, *_gate_inputs(prob)).setup
        assert setup["kv_bytes"] == B * 8 * T * 128 * 4
        assert f",EVICT={want}" in setup["decode_config"] and (setup["kv_bytes"] <= 3 * l2) == bool(want), setup


# ---- OV: the products of consecutive tiles in flight together ---------------------------------------------------
def test_the_overlapped_walk_is_the_warpgroup_builds_and_takes_three_stages():
    """OV=1 compiles DECODE_OV into the rows kernel's warpgroup MMA build only (the mma.sync build, the key slices and a
    warp a pair ignore it), and a shape of 2 stages with it is refused with the field and the limit."""
    m = make_mask("window", 4096, True, window=1000)
    ov = parse_decode_config("OV=1").apply()
    assert kernel_defines(128, "bfloat16", m, ov, wg=True)["DECODE_OV"] == 1
    assert "DECODE_OV" not in kernel_defines(128, "bfloat16", m, DEFAULT, wg=True) and DEFAULT.OV == 0
    for kw in (dict(), dict(keys=True), dict(pairs=True)):
        assert "DECODE_OV" not in kernel_defines(128, "bfloat16", m, ov, **kw), kw
    assert "OV=1" in parse_decode_config("OV=1,STAGES=2").apply().problem(128)
    assert parse_decode_config("OV=1,STAGES=2").apply().problem(128, keys=True) is None
    assert ov.problem(128) is None and parse_decode_config("OV=1,STAGES=4").apply().problem(64) is None
    with pytest.raises(BadInput, match="OV=2"):
        parse_decode_config("OV=2")


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["OV=1", "OV=1,CLUSTER=0", "OV=1,NWARPS=8,KWG=2", "OV=1,STAGES=4,CLUSTER=0"])
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("streaming", {"sink": 4, "window": 1000}),
                                            ("window", {"window": 3000}), ("dilated", {"window": 512, "dilation": 2}),
                                            ("bigbird", {})])
def test_the_overlapped_walk_passes_the_gate(spec, pattern, params):
    """OV=1 through the gate on a ragged batch (lists from one tile to 256, a sequence of 64 keys, 1000 and 3008 off
    the tiles' edges; BigBird, whose ragged batch every implementation refuses, on two of 16384), 64 rows a group (4
    heads x Tq=16): in a cluster and with the merge launch, one warpgroup and two on the rows, 3 stages and 4; on sm_90
    the rows kernel runs on warpgroup MMA with the overlapped walk."""
    import cupy

    mask = make_mask(pattern, 16384, True, **params)
    lens = ((16384, 16384) if pattern == "bigbird"  # (a ragged BigBird batch is refused: one length)
            else (16384, 4096, 1024, 2048, 8192, 64, 3008, 1000))
    setups = _ragged_gates(mask, 16, 8, 2, {spec: spec}, lens=lens)
    s = setups[spec]
    assert s["kernel"] == KERNEL and "OV=1" in s["decode_config"], s
    assert s["wgmma"] == (cupy.cuda.Device().compute_capability == "90"), s


# ---- KWG: two warpgroups on the same rows, a slice of every tile each ---------------------------------------
def test_two_warpgroups_on_key_slices_take_the_rows_kernels_shape_and_refuse_the_others():
    """KWG=2: 64 rows a block (two warpgroups on them), the kernel's BN a warpgroup's slice of the shape's BN-key
    tiles (whose lists and stages keep BN), only on warpgroup MMA; NWARPS other than 8, slices of other than 32, 64
    or 128 keys, and the mma.sync build are refused by name."""
    cfg = parse_decode_config("NWARPS=8,KWG=2,BN=128").apply()
    assert cfg.rows == 64 and cfg.threads == 256 and cfg.smem_bytes(128) == (64 + 2 * 3 * 128) * 128 * 2
    assert cfg.problem(128) is None and cfg.problem(64) is None and cfg.wgmma(False, "90")
    assert not cfg.wgmma(False, "80") and not cfg.wgmma(True, "90")
    m = make_mask("window", 4096, True, window=4096)
    d = kernel_defines(128, "bfloat16", m, cfg, wg=True)
    assert (d["KWG"], d["BN"], d["NWARPS"], d["WG"]) == (2, 64, 8, 1)
    assert "KWG" not in kernel_defines(128, "bfloat16", m, wg=True) and DEFAULT.KWG == 0 and DEFAULT.rows == 64
    assert kernel_defines(128, "bfloat16", m, cfg, keys=True)["BN"] == 16  # the key slices' kernel ignores it
    with pytest.raises(ValueError, match="KWG=2"):
        kernel_defines(128, "bfloat16", m, cfg)
    assert "NWARPS=8, not 4" in parse_decode_config("KWG=2").apply().problem(128)
    assert "BN=32" in parse_decode_config("NWARPS=8,KWG=2,BN=32").apply().problem(128)
    assert parse_decode_config("NWARPS=8,KWG=2").apply().problem(128) is None  # 32-key slices
    # a short list keeps the shape's tiles where the short ones' slices (16 keys) cannot be built
    assert cfg.for_list(100, 64, 128, "90") == cfg
    assert parse_decode_config("NWARPS=8,KWG=2").apply().for_list(100, 64, 128, "90").BN == 64
    with pytest.raises(BadInput, match="KWG=3"):
        parse_decode_config("KWG=3")


def test_two_warpgroups_take_the_rows_where_the_pairs_are_neither_few_nor_many_and_the_list_long():
    """KWG 0 (the default): for_list gives NWARPS=8,KWG=2 on the shape's own tiles where the rows kernel runs on
    warpgroup MMA (sm_90), a block has more than 16 rows, the pairs are neither few (B=1 against 8 key/value heads)
    nor more than the SMs, and the list is longer than WG_SHORT_LIST_KEYS; else KWG=1 and the tiles as before."""
    from attnbench.decode_config import WG_SHORT_LIST_KEYS
    from attnbench.decode import plan_lists

    two = DEFAULT.for_list(4111, 64, 128, "90", many_pairs=False, middle_pairs=True)
    assert (two.KWG, two.NWARPS, two.BN) == (2, 8, 64) and ",KWG=2," in two.spec
    assert DEFAULT.for_list(1100, 64, 128, "90", middle_pairs=True).KWG == 2  # not the 32-key tiles
    for args in ((4111, 64, 128, "80", False, True), (4111, 64, 128, "90", False, False),
                 (4111, 64, 128, "90", True, False), (4111, 16, 128, "90", False, True),
                 (WG_SHORT_LIST_KEYS, 64, 128, "90", False, True)):
        got = DEFAULT.for_list(*args)
        assert got.KWG == 1 and got.NWARPS == 4, (args, got)
    assert DEFAULT.for_list(WG_SHORT_LIST_KEYS, 64, 128, "90", False, True).BN == 32  # the short tiles as before
    assert replace(DEFAULT, KWG=1).for_list(4111, 64, 128, "90", False, True).KWG == 1
    # B=8 against 8 key/value heads on 132 SMs: 64 pairs; B=1: few; B=64: many
    mask = make_mask("window", 32768, True, window=4096)
    for B, want in ((8, 2), (1, 1), (64, 1)):
        prob = Problem(mask, B, 32, 128, "bfloat16", H_kv=8, Tq=16)
        cfg, _, _, _ = plan_lists(prob, DEFAULT, [prob.T], None, "90", 132)
        assert cfg.KWG == want, (B, cfg.spec)


@pytest.mark.gpu
@pytest.mark.parametrize("text", ("NWARPS=8,KWG=2", "NWARPS=8,KWG=2,BN=128", "NWARPS=8,KWG=2,BN=128,SPLITS=1",
                                  "NWARPS=8,KWG=2,SPLITS=5,CLUSTER=0", "NWARPS=8,KWG=2,BN=128,MERGE=1",
                                  "NWARPS=8,KWG=2,BN=128,STAGES=2,BY_KEYS=0", "NWARPS=8,KWG=2,SPLITS=3,CLUSTER=8"))
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("streaming", {"sink": 4, "window": 64}),
                                            ("window", {"window": 100}), ("dilated", {"window": 512, "dilation": 2}),
                                            ("window", {"window": 4096})])
def test_gate_of_two_warpgroups_on_key_slices(text, pattern, params):
    """KWG=2 on sm_90: the rows kernel's two warpgroups on the same rows, each on its half of every tile, merged
    in shared memory, through the gate on groups of 64 rows (4 heads x Tq=16; 8 heads x Tq=8 at D=64, float16)
    and of 12 rows (BY_KEYS=0), ragged, odd lengths, with a cluster's merge, the merge launch, the last split's
    merge and a single split; the run says it ran the warpgroup build with the shape."""
    import cupy

    from attnbench.check import gate

    if cupy.cuda.Device().compute_capability != "90":
        pytest.skip("KWG runs on sm_90's warpgroup MMA")
    impl = IMPL.decode_variant(parse_decode_config(text))
    mask = make_mask(pattern, 4096, True, **params)
    for prob in (Problem(mask, 1, 32, 128, "bfloat16", H_kv=8, Tq=16),
                 Problem(mask, 2, 16, 64, "float16", H_kv=2, Tq=8),
                 Problem(mask, 3, 8, 128, "bfloat16", H_kv=2, Tq=16, cache_lens=(4096, 1001, 3007)),
                 Problem(mask, 2, 8, 128, "bfloat16", H_kv=2, Tq=3, cache_lens=(4095, 77))):
        setup = impl.prepare(prob, *_gate_inputs(prob)).setup
        keys = impl.shape().by_keys(prob.H // prob.kv_heads // setup["heads"] * prob.q_len, prob.D)
        assert setup["wgmma"] != keys and ",KWG=2" in setup["decode_config"], (text, setup)
        res = gate(impl, prob)
        assert res.ok, (text, prob.q_len, res)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,params", [("window", {"window": 4096}), ("dilated", {"window": 512, "dilation": 2})])
def test_two_warpgroups_take_the_rows_by_default_where_the_pairs_are_neither_few_nor_many(pattern, params):
    """On sm_90, B=8 against 8 key/value heads at Tq=16 (64 pairs of 64 rows, a list of over 256 keys) runs
    NWARPS=8,KWG=2 by default and passes the gate; B=1 keeps one warpgroup."""
    import cupy

    from attnbench.check import gate

    if cupy.cuda.Device().compute_capability != "90" or cupy.cuda.Device().attributes["MultiProcessorCount"] < 64:
        pytest.skip("KWG runs on sm_90's warpgroup MMA; 64 pairs must not outnumber the SMs")
    mask = make_mask(pattern, 8192, True, **params)
    for B, nwarps, kwg in ((8, 8, 2), (1, None, 1)):
        prob = Problem(mask, B, 32, 128, "bfloat16", H_kv=8, Tq=16)
        setup = IMPL.prepare(prob, *_gate_inputs(prob)).setup
        fields = dict(parse_decode_config(setup["decode_config"]).given)
        assert fields["KWG"] == kwg and nwarps in (None, fields["NWARPS"]) and setup["wgmma"], setup
        res = gate(IMPL, prob)
        assert res.ok, (B, res)


# ---- HEADS: a group's query heads dealt to blocks --------------------------------------------------------
def test_a_groups_heads_are_dealt_to_blocks_where_given_or_where_pairs_are_few_and_lists_short():
    """heads_split: HEADS where given; HEADS=0 splits a group whose rows exceed 16 into the fewest blocks of 16 rows
    or fewer, only where the SMs number at least ONE_PER_SM for each pair (B=1 against 8 key/value heads on 132
    SMs, not B=8) and the list holds at most HEADS_MAX_KEYS keys; groups whose rows already fit 16, or whose
    heads cannot be dealt to fit, stay whole."""
    from attnbench.decode_config import HEADS_MAX_KEYS

    auto = DecodeConfig(HEADS=0)
    assert auto.heads_split(4, 16, 8, 132, 384) == 4  # B=1, Tq=16, BigBird's list: one head's 16 rows a block
    assert auto.heads_split(4, 16, 8, 132, HEADS_MAX_KEYS + 32) == 1  # a longer list: L2 would serve it 4 times
    assert auto.heads_split(4, 16, 64, 132, 384) == 1  # B=8: 64 pairs, two SMs each
    assert auto.heads_split(4, 4, 8, 132, 384) == 1  # 16 rows already
    assert auto.heads_split(8, 4, 8, 132, 384) == 2  # 32 rows: two blocks of 16
    assert auto.heads_split(4, 32, 8, 132, 384) == 1  # one head's 32 rows cannot fit 16
    assert replace(auto, ONE_PER_SM=0).heads_split(4, 16, 8, 132, 384) == 1
    assert DecodeConfig(HEADS=2).heads_split(4, 16, 64, 132, 1 << 20) == 2 and DEFAULT.HEADS == 0


def test_a_heads_split_that_does_not_divide_the_group_is_refused_and_one_that_fits_takes_the_key_slices():
    mask = make_mask("window", 4096, True, window=4096)
    why = IMPL.decode_variant(parse_decode_config("HEADS=3")).unsupported(Problem(mask, 1, 32, 128, "bfloat16",
                                                                                  H_kv=8, Tq=16))
    assert why and "HEADS=3 does not divide the 4 query heads of a key/value head" in why
    # 8 heads a group x Tq=16 = 128 rows: past the rows kernel's 64, unless dealt to 2 blocks (64 rows) or more
    big = Problem(mask, 1, 64, 128, "bfloat16", H_kv=8, Tq=16)
    assert "exceed 64" in IMPL.unsupported(big)
    assert IMPL.decode_variant(parse_decode_config("HEADS=2")).unsupported(big) is None
    assert DecodeConfig().by_keys(4 // 4 * 16, 128)  # HEADS=4 at Tq=16: one head's 16 rows, the key slices
    m = make_mask("dense", 4096, True)
    assert "HSPLIT" not in kernel_defines(128, "bfloat16", m, keys=True)
    assert kernel_defines(128, "bfloat16", m, keys=True, heads=4)["HSPLIT"] == 4


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("keys,pairs", [(True, False), (False, False), (False, True)])
def test_the_heads_split_builds_compile_without_spills(arch, keys, pairs):
    from attnbench.decode import PAIRS_KERNEL

    mask = make_mask("streaming", 4096, True, sink=4, window=1024)
    cfg = replace(DEFAULT, BN=32) if pairs else DEFAULT
    kernel = PAIRS_KERNEL if pairs else KEYS_KERNEL if keys else KERNEL
    reports = compile_only(kernel, kernel_defines(128, "bfloat16", mask, cfg, keys, pairs=pairs, heads=4), arch)
    for r in reports:
        assert 0 < r.registers <= 255 and (r.spill_stores, r.spill_loads) == (0, 0), r


@pytest.mark.gpu
@pytest.mark.parametrize("text", ("HEADS=4", "HEADS=2", "HEADS=4,SPLITS=1", "HEADS=4,SPLITS=5,CLUSTER=0",
                                  "HEADS=4,SPLITS=6", "HEADS=2,BY_KEYS=0", "HEADS=0", "HEADS=4,BY_PAIRS=1",
                                  "HEADS=4,MERGE=1,BY_KEYS=0"))
@pytest.mark.parametrize("pattern,params", [("dense", {}), ("streaming", {"sink": 4, "window": 64}),
                                            ("window", {"window": 100}), ("dilated", {"window": 512, "dilation": 2})])
def test_gate_with_a_groups_heads_dealt_to_blocks(text, pattern, params):
    """HEADS: each block takes some of a group's query heads against the key/value head they share (the kernels'
    HSPLIT), on groups of 4 heads at Tq 1, 4 and 16, ragged, both dtypes and head dims, with the merge launch, a
    cluster, the last split's merge, a single split and a warp a pair; the run says how many blocks a group took."""
    from attnbench.check import gate

    impl = IMPL.decode_variant(parse_decode_config(text))
    mask = make_mask(pattern, 4096, True, **params)
    ran = 0
    for prob in (Problem(mask, 1, 32, 128, "bfloat16", H_kv=8, Tq=16),
                 Problem(mask, 2, 8, 64, "float16", H_kv=2, Tq=4),
                 Problem(mask, 3, 8, 128, "bfloat16", H_kv=2, Tq=4, cache_lens=(4096, 1000, 3008)),
                 Problem(mask, 2, 32, 128, "bfloat16", H_kv=8, Tq=1)):
        if impl.unsupported(prob):
            continue
        setup = impl.prepare(prob, *_gate_inputs(prob)).setup
        # HEADS=0: B=1 at Tq=16 only, on the short lists (streaming 4+64, window 100; not dense's 4096 keys, nor the
        # dilation's 1056)
        want = impl.shape().HEADS or (4 if prob.q_len == 16 and pattern in ("streaming", "window") else 1)
        assert setup["heads"] == want, (text, prob.q_len, setup)
        res = gate(impl, prob)
        assert res.ok, (text, prob.q_len, res)
        ran += 1
    assert ran >= 3
