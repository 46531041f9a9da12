"""GPU dev script for the fast-tc kernels: gate, then time against FlexAttention and SDPA.

(a) gates fast-tc on every pattern of SPEC's llm configuration at T=4096 (B=1, H=16);
(b) times fast-tc at T=32768 (B=1, H=16, D=64, bfloat16) for every llm pattern and dense causal
    at T=16384 for D=64 and 128, interleaved in one process with FlexAttention
    (torch.compile(flex_attention), the same mask as a mask_mod, best of block 64 and 128) and,
    for dense causal, SDPA pinned to FLASH_ATTENTION and CUDNN_ATTENTION. CUDA events; the L2
    is flushed (a write of twice its size) before every sample; median of the samples.
Prints a table and writes JSON to $OUT/fast_tc_dev.json when OUT is set.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 scripts/fast_tc_dev.py [--quick] [--no-flex]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np

# SPEC section 6 ceilings (H200), used when the in-run measurement fails
SPEC_BF16_TFLOPS = 794.0
SPEC_COPY_TBS = 4.23

SLEEP_CYCLES = 200_000  # about 0.1 ms of GPU time queued ahead of each timed launch

# SPEC section 5, llm configuration: (label, pattern, causal, params)
LLM = [
    ("streaming S=16 W=64", "streaming", True, dict(sink=16, window=64)),
    ("streaming S=4 W=1024", "streaming", True, dict(sink=4, window=1024)),
    ("window 256", "window", True, dict(window=256)),
    ("window 4096", "window", True, dict(window=4096)),
    ("block_diagonal 16", "block_diagonal", False, dict(block=16)),
    ("block_diagonal 128", "block_diagonal", False, dict(block=128)),
    ("dilated W=512 r=2", "dilated", True, dict(window=512, dilation=2)),
    ("bigbird 64/3/1/3", "bigbird", True, dict(block=64, window_blocks=3, global_blocks=1, random_blocks=3)),
    ("dense causal", "dense", True, {}),
]


# ---- timing --------------------------------------------------------------------------------------
class Timer:
    """Interleaved CUDA-event timing with an L2 flush before every sample."""

    def __init__(self):
        import torch

        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush_buf = torch.empty(max(2 * l2, 1 << 26) // 4, dtype=torch.int32, device="cuda")

    def time(self, fns: dict, samples: int = 25, warmup: int = 3) -> dict:
        import torch

        for fn in fns.values():
            for _ in range(warmup):
                fn()
        torch.cuda.synchronize()
        res = {name: [] for name in fns}
        for _ in range(samples):
            evs = []
            for name, fn in fns.items():
                self.flush_buf.fill_(1)
                # keep the GPU busy while the host launches, so launch overhead stays out
                torch.cuda._sleep(SLEEP_CYCLES)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                evs.append((name, a, b))
            torch.cuda.synchronize()
            for name, a, b in evs:
                res[name].append(a.elapsed_time(b))
        out = {}
        for name, xs in res.items():
            xs = sorted(xs)
            out[name] = dict(ms=statistics.median(xs), p20=xs[int(0.2 * (len(xs) - 1))],
                             p80=xs[int(0.8 * (len(xs) - 1))], n=len(xs))
        return out


def measure_ceilings(timer: Timer) -> dict:
    import torch

    try:
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        t = timer.time({"mm": lambda: torch.matmul(a, b), "copy": lambda: dst.copy_(src)}, samples=20)
        return dict(bf16_tflops=2 * n ** 3 / t["mm"]["ms"] / 1e9, copy_tbs=2 * src.numel() / t["copy"]["ms"] / 1e9,
                    measured=True)
    except Exception as e:  # keep going on the SPEC ceilings
        print(f"ceiling measurement failed: {e}")
        return dict(bf16_tflops=SPEC_BF16_TFLOPS, copy_tbs=SPEC_COPY_TBS, measured=False)


# ---- peers ---------------------------------------------------------------------------------------
def flex_runners(mask, q, k, v, blocks=(64, 128)) -> dict:
    """FlexAttention at each block size: {label: (fn, setup_s)}; failures are reported and skipped."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    mm = mask.mask_mod("cuda")  # the pattern's own predicate
    T = mask.T
    out = {}
    for bs in blocks:
        try:
            t0 = time.perf_counter()
            bm = create_block_mask(mm, None, None, T, T, device="cuda", BLOCK_SIZE=bs, _compile=True)
            opts = {"BLOCK_M": bs, "BLOCK_N": bs} if bs == 64 else None
            fn = (lambda bm=bm, opts=opts: flex(q, k, v, block_mask=bm, kernel_options=opts))
            fn()
            torch.cuda.synchronize()
            out[f"flex{bs}"] = (fn, time.perf_counter() - t0)
        except Exception as e:
            print(f"  flex block {bs} failed: {type(e).__name__}: {str(e)[:200]}")
    return out


def sdpa_runners(q, k, v) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {}
    for label, be in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        def fn(be=be):
            with sdpa_kernel(be):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        try:
            fn()
            torch.cuda.synchronize()
            out[label] = (fn, 0.0)
        except Exception as e:
            print(f"  {label} failed: {type(e).__name__}: {str(e)[:200]}")
    return out


# ---- the two parts -------------------------------------------------------------------------------
def gate_all(T: int, dims, dtypes) -> list[dict]:
    from attnbench.check import gate
    from attnbench.fast_tc import IMPL
    from attnbench.impls import Problem
    from attnbench.patterns import make_mask

    rows = []
    for label, name, causal, params in LLM:
        mask = make_mask(name, T, causal, **params)
        for D in dims:
            for dtype in dtypes:
                try:
                    r = gate(IMPL, Problem(mask, 1, 16, D, dtype))
                    rows.append(dict(pattern=label, T=T, D=D, dtype=dtype, ok=r.ok, rel_err=r.rel_err, reason=r.reason))
                except Exception as e:
                    rows.append(dict(pattern=label, T=T, D=D, dtype=dtype, ok=False, rel_err=math.nan,
                                     reason=f"{type(e).__name__}: {e}"))
                x = rows[-1]
                print(f"gate {label:22s} T={T} D={D:3d} {dtype:8s} {'PASS' if x['ok'] else 'FAIL'} "
                      f"err={x['rel_err']:.2e} {x['reason']}")
    return rows


def time_case(timer, ceil, label, name, causal, params, T, D, H, flex_blocks, samples, cfg=None) -> list[dict]:
    import torch

    from attnbench.arrays import bind
    from attnbench.check import judge
    from attnbench.fast_tc import IMPL, choose_config, tile_list
    from attnbench.impls import Problem
    from attnbench.patterns import make_mask

    mask = make_mask(name, T, causal, **params)
    prob = Problem(mask, 1, H, D, "bfloat16")
    g = torch.Generator(device="cuda").manual_seed(T + D)
    q, k, v = (torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    cq, ck, cv = (bind(x, n).array for x, n in ((q, "q"), (k, "k"), (v, "v")))
    runner = IMPL.prepare(prob, cq, ck, cv, cfg=cfg)
    runner.run()
    torch.cuda.synchronize()
    fns = {"fast-tc": (runner.run, runner.setup.get("compile_s", 0.0))}
    peers = dict(flex_runners(mask, q, k, v, flex_blocks)) if flex_blocks else {}
    if name == "dense" and causal:
        peers.update(sdpa_runners(q, k, v))
    # agreement with the first peer (gross-error check on the timed inputs)
    agree = None
    if peers:
        ref = next(iter(peers.values()))[0]().float()
        ours = torch.from_dlpack(runner.out.view(np.int16)).view(torch.bfloat16).float()
        agree = float((ours - ref).norm() / ref.norm())
    fns.update(peers)
    t = timer.time({n: f for n, (f, _) in fns.items()}, samples=samples)
    flops, bytes_ = prob.flops, prob.bytes_floor
    floor_ms = max(flops / (ceil["bf16_tflops"] * 1e12), bytes_ / (ceil["copy_tbs"] * 1e12)) * 1e3
    c = cfg or choose_config(mask, D, IMPL.uses_wgmma())
    tiles = tile_list(mask, c.BM, c.BN)
    flex_best = min((t[n]["ms"] for n in t if n.startswith("flex")), default=None)
    sdpa = {n: t[n]["ms"] for n in t if n.startswith("sdpa")}
    rows = []
    for n, x in t.items():
        rows.append(dict(case=label, impl=n, T=T, D=D, H=H, ms=x["ms"], p20=x["p20"], p80=x["p80"], n=x["n"],
                         tflops=flops / x["ms"] / 1e9, floor_ms=floor_ms, roofline=floor_ms / x["ms"],
                         setup_s=fns[n][1], vs_flex=(flex_best / x["ms"]) if flex_best else None,
                         vs_sdpa_flash=(sdpa["sdpa-flash"] / x["ms"]) if "sdpa-flash" in sdpa else None,
                         agree=agree if n == "fast-tc" else None,
                         tiles=tiles.n_visited if n == "fast-tc" else None, cfg=str(c) if n == "fast-tc" else None,
                         partial=tiles.n_partial if n == "fast-tc" else None))
    del q, k, v, cq, ck, cv, runner
    torch.cuda.empty_cache()
    return rows


def parse_cfg(text: str):
    """'NWARPS,BN,STAGES[,MT[,MINB[,QREG[,WG[,TMA]]]]]' -> TileConfig."""
    from attnbench.fast_tc import TileConfig

    return TileConfig(*(int(x) for x in text.split(",")))


def sweep(timer, ceil, variants, samples, only="", dense_T=(16384,)) -> list[dict]:
    """Gate each tile configuration, then time them interleaved on a few cases (fast-tc only)."""
    import torch

    from attnbench.arrays import bind, random_inputs
    from attnbench.check import judge
    from attnbench.fast_tc import IMPL
    from attnbench.impls import Problem
    from attnbench.patterns import make_mask

    rows = []
    for D, cfgs in variants.items():
        ok_cfgs = []
        for c in cfgs:
            good = True
            for name, causal, params in (("dense", True, {}), ("streaming", True, {}), ("dilated", False, {}),
                                         ("bigbird", True, dict(block=40))):
                prob = Problem(make_mask(name, 1000, causal, **params), 2, 3, D, "bfloat16")
                q, k, v = random_inputs(prob.shape, prob.dtype, seed=11)
                r = judge(IMPL, prob, IMPL.prepare(prob, q, k, v, cfg=c), q, k, v)
                good &= r.ok
                if not r.ok:
                    print(f"sweep gate FAIL D={D} {c} {name}: {r.reason}")
            if good:
                ok_cfgs.append(c)
        cases = [(lab, n, c_, p, T) for lab, n, c_, p in LLM for T in (dense_T if n == "dense" else (32768,))]
        if only:
            cases = [x for x in cases if any(o in x[0] for o in only.split(","))]
        elif D == 128:
            cases = [x for x in cases if x[1] in ("dense", "streaming", "window")][:3] + cases[-1:]
        for lab, n, causal, p, T in cases:
            mask = make_mask(n, T, causal, **p)
            prob = Problem(mask, 1, 16, D, "bfloat16")
            g = torch.Generator(device="cuda").manual_seed(5)
            q, k, v = (torch.randn(1, 16, T, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            cq, ck, cv = (bind(x, nm).array for x, nm in ((q, "q"), (k, "k"), (v, "v")))
            fns = {}
            for c in ok_cfgs:
                fns[c] = IMPL.prepare(prob, cq, ck, cv, cfg=c).run
            if n == "dense" and causal:  # SDPA's backends in the same interleaved timing
                fns.update({nm: f for nm, (f, _) in sdpa_runners(q, k, v).items()})
            t = timer.time(fns, samples=samples)
            floor_ms = max(prob.flops / (ceil["bf16_tflops"] * 1e12), prob.bytes_floor / (ceil["copy_tbs"] * 1e12)) * 1e3
            best = min(x["ms"] for x in t.values())
            for c, x in t.items():
                rows.append(dict(case=lab, D=D, T=T, cfg=str(c), ms=x["ms"], p20=x["p20"], p80=x["p80"],
                                 tflops=prob.flops / x["ms"] / 1e9, roofline=floor_ms / x["ms"]))
                name = c if isinstance(c, str) else ",".join(str(x) for x in c.__dict__.values())
                print(f"sweep {lab:22s} D={D:3d} T={T} {name}: "
                      f"{x['ms']:8.4f} ms  {prob.flops / x['ms'] / 1e9:6.1f} TF/s  roof {floor_ms / x['ms']:6.1%}"
                      f"{'  *' if x['ms'] == best else ''}")
            del q, k, v, cq, ck, cv, fns
            torch.cuda.empty_cache()
    return rows


def profile_once(label: str, D: int):
    """Prepare fast-tc for one case and launch it twice (for ncu)."""
    import cupy

    from attnbench.arrays import random_inputs
    from attnbench.fast_tc import IMPL
    from attnbench.impls import Problem
    from attnbench.patterns import make_mask

    lab, n, causal, p = next(x for x in LLM if label in x[0])
    prob = Problem(make_mask(n, 32768 if n != "dense" else 16384, causal, **p), 1, 16, D, "bfloat16")
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=1)
    r = IMPL.prepare(prob, q, k, v)
    r.run()
    r.run()
    cupy.cuda.get_current_stream().synchronize()


def print_table(rows):
    print(f"\n{'case':22s} {'impl':11s} {'T':>6s} {'D':>4s} {'ms':>8s} {'TF/s':>7s} {'floor':>7s} {'roof':>6s} "
          f"{'xFlex':>6s} {'xSDPAf':>6s} {'agree':>8s}")
    for r in rows:
        f = lambda x, fmt: (fmt % x) if x is not None else "-"
        print(f"{r['case']:22s} {r['impl']:11s} {r['T']:6d} {r['D']:4d} {r['ms']:8.4f} {r['tflops']:7.1f} "
              f"{r['floor_ms']:7.4f} {r['roofline']:6.1%} {f(r['vs_flex'], '%6.2f')} {f(r['vs_sdpa_flash'], '%6.2f')} "
              f"{f(r['agree'], '%8.1e')}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="gate D=64 bfloat16 only, 20 samples")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--flex-blocks", default="64,128")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--only", default="", help="comma-separated case labels (substring match)")
    ap.add_argument("--sweep", default="", help="D:NWARPS,BN,STAGES[,MT[,MINB[,QREG[,WG[,TMA]]]]];... tile configurations to compare")
    ap.add_argument("--sweep-cases", default="", help="comma-separated case labels the --sweep times (substring match)")
    ap.add_argument("--dense-T", default="16384", help="comma-separated T of the dense cases (--sweep and the comparison)")
    ap.add_argument("--profile", default="", help="run one case (label substring) twice and exit (for ncu)")
    ap.add_argument("--profile-d", type=int, default=64)
    args = ap.parse_args(argv)
    import torch
    import torch._dynamo

    # one compiled flex kernel and one block-mask build per pattern: lift the recompile limits
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    if args.profile:
        profile_once(args.profile, args.profile_d)
        return 0

    dev = torch.cuda.get_device_name(0)
    print(f"device: {dev}, torch {torch.__version__}")
    result = dict(device=dev, torch=torch.__version__)
    if not args.no_gate:
        dims, dtypes = ((64,), ("bfloat16",)) if args.quick else ((64, 128), ("bfloat16", "float16"))
        result["gates"] = gate_all(4096, dims, dtypes)
    dense_Ts = tuple(int(x) for x in args.dense_T.split(","))
    timer = Timer()
    ceil = measure_ceilings(timer)
    print(f"ceilings: {ceil}")
    result["ceilings"] = ceil
    if args.sweep:
        variants = {}
        for part in args.sweep.split(";"):
            d, cfgs = part.split(":")
            variants[int(d)] = [parse_cfg(c) for c in cfgs.split("/")]
        result["sweep"] = sweep(timer, ceil, variants, args.samples, args.sweep_cases, dense_Ts)
    blocks = () if args.no_flex else tuple(int(b) for b in args.flex_blocks.split(",") if b)
    cases = [(lab, n, c, p, 32768, 64) for lab, n, c, p in LLM if n != "dense"]
    cases += [("dense causal", "dense", True, {}, T, D) for T in dense_Ts for D in (64, 128)]
    if args.only:
        keys = [s.strip() for s in args.only.split(",")]
        cases = [c for c in cases if any(kk in c[0] for kk in keys)]
    rows = []
    for lab, n, c, p, T, D in cases:
        try:
            rows += time_case(timer, ceil, lab, n, c, p, T, D, 16, blocks, args.samples)
        except Exception:
            print(f"timing {lab} T={T} D={D} failed:\n{traceback.format_exc()}")
        print_table(rows[-4:]) if rows else None
    result["timings"] = rows
    print_table(rows)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fast_tc_dev.json"), "w") as f:
            json.dump(result, f, indent=1, default=float)
    bad = [g for g in result.get("gates", []) if not g["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
