"""Tile-list build times for the llm configuration's patterns: the host build (attnbench.tiles.build,
each list built afresh `--repeat` times: first, median, min) and, when a GPU is present, the list's
expansion on the device. One row per (pattern, D) with the tile shape fast-tc chooses.

    python3 scripts/tile_build_times.py [--T 131072] [--repeat 15] [--out tile_build.csv]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-device", action="store_true", help="host build only")
    a = ap.parse_args(argv)

    import pandas as pd

    from attnbench.fast_tc import IMPL, choose_config
    from attnbench.patterns import make_mask
    from attnbench.results import provenance
    from attnbench.configs import LLM
    from attnbench.tiles import DeviceTiles, build

    device = not a.no_device
    if device:
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # no GPU here: host times only
            print(f"no device ({type(e).__name__}): host build only")
            device = False
    prov = provenance() if device else {}
    rows = []
    for inst in LLM.instances:
        mask = make_mask(inst.pattern, a.T, inst.causal, **inst.param_dict)
        for D in (64, 128):
            cfg = choose_config(mask, D, device and IMPL.uses_wgmma())  # the shape fast-tc takes here
            inner = mask.strided()[1]
            host = [build(inner, cfg.BM, cfg.BN) for _ in range(a.repeat)]
            hs = [t.build_s * 1e3 for t in host]
            row = dict(pattern=mask.label(), causal=inst.causal, T=a.T, D=D, BM=cfg.BM, BN=cfg.BN,
                       entries=host[0].n_visited, partial=host[0].n_partial, runs=int(host[0].run_off.size),
                       host_first_ms=hs[0], host_median_ms=statistics.median(hs), host_min_ms=min(hs),
                       cpu=platform.processor() or platform.machine(), cpus=os.cpu_count())
            if device:
                DeviceTiles.expand(host[0])  # the first expansion compiles CuPy's kernels
                ds = [DeviceTiles.expand(t).build_s * 1e3 for t in host]
                row.update(device_median_ms=statistics.median(ds), device_min_ms=min(ds),
                           gpu=prov.get("gpu"), git_commit=prov.get("git_commit"))
            rows.append(row)
            print(f"{row['pattern']:68s} D={D:3d} {cfg.BM:3d}x{cfg.BN:<3d} entries {row['entries']:8d} "
                  f"runs {row['runs']:6d}  host first {hs[0]:6.3f} median {row['host_median_ms']:6.3f} "
                  f"min {row['host_min_ms']:6.3f} ms"
                  + (f"  device median {row['device_median_ms']:6.3f} ms" if device else ""), flush=True)
    if a.out:
        pd.DataFrame(rows).to_csv(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
