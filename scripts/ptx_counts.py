"""PTX instruction counts, PTX and cubin hashes, registers and spills of fast_tc's builds, through NVRTC
(no GPU), for the attnbench found on PYTHONPATH; or two such listings compared.

    PYTHONPATH=OLD_TREE python scripts/ptx_counts.py > old.json   # a checkout of the earlier commit
    PYTHONPATH=.        python scripts/ptx_counts.py > new.json
    python scripts/ptx_counts.py --compare old.json new.json

Builds: the fast_tc ones of ``attnbench compile`` (``--gate-builds``: of the GPU gate too), on sm_80
(mma.sync builds) and sm_90a (all); ``--group G`` (repeatable) adds each build at KV_GROUP G beside it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

INSTR = re.compile(r"^\s+(@!?%\w+\s+)?[a-z][\w.:]*[\s;]")


def count(text: str) -> int:
    """Instructions: indented lines ending in ';' that are not directives or labels."""
    n = 0
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".")) or s.endswith(":") or s in ("{", "}"):
            continue
        n += bool(INSTR.match(line) and s.endswith(";"))
    return n


def listing(gate: bool, groups: list[int]) -> list[dict]:
    from attnbench import compile as kc
    from attnbench.fast_tc import gate_builds, standard_builds

    builds = [b for b in standard_builds() if b[0] == "fast_tc"]
    if gate:
        builds += [b for b in gate_builds() if b[0] == "fast_tc" and b not in builds]
    builds += [(n, {**d, "KV_GROUP": g}) for g in groups for n, d in list(builds) if "KV_GROUP" not in d]
    out = []
    for name, d in builds:
        for arch in ("sm_90a",) if d.get("WG") else ("sm_80", "sm_90a"):
            text = kc.ptx(name, d, arch)
            (r,) = [r for r in kc.compile_only(name, d, arch) if r.kernel.startswith("fast_tc_fwd")]
            out.append(dict(defines=d, arch=arch, ptx_instr=count(text),
                            ptx_sha=hashlib.sha256(text.encode()).hexdigest()[:16], cubin=r.cubin_sha256[:16],
                            registers=r.registers, spills=r.spill_stores + r.spill_loads))
    return out


def compare(a: list[dict], b: list[dict]) -> None:
    key = lambda r: (json.dumps(r["defines"], sort_keys=True), r["arch"])  # noqa: E731
    old = {key(r): r for r in a}
    both = [(old[key(r)], r) for r in b if key(r) in old]
    print(f"{len(both)} builds in both: PTX identical {sum(x['ptx_sha'] == y['ptx_sha'] for x, y in both)}, "
          f"cubins identical {sum(x['cubin'] == y['cubin'] for x, y in both)}, "
          f"same instruction count {sum(x['ptx_instr'] == y['ptx_instr'] for x, y in both)}")
    for x, y in both:
        if x["ptx_instr"] != y["ptx_instr"] or x["registers"] != y["registers"]:
            print(f"  {y['arch']} {key(y)[0]}: {x['ptx_instr']} -> {y['ptx_instr']} instructions, "
                  f"{x['registers']} -> {y['registers']} registers")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gate-builds", action="store_true")
    ap.add_argument("--group", type=int, action="append", default=[])
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = ap.parse_args()
    if args.compare:
        compare(*(json.loads(Path(f).read_text()) for f in args.compare))
        return
    json.dump(listing(args.gate_builds, args.group), sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
