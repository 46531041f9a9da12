"""SASS opcode counts of fast-decode's cluster builds, through NVRTC (no GPU), for the attnbench found on
PYTHONPATH; or two such listings compared.

    PYTHONPATH=OLD_TREE python scripts/sass_opcodes.py > old.json   # a checkout of the earlier commit
    PYTHONPATH=.        python scripts/sass_opcodes.py > new.json
    python scripts/sass_opcodes.py --compare old.json new.json

Each build is compiled for sm_90a to a cubin; each kernel's ``.text.<name>`` section holds its instructions, 16 bytes
each, and the low 12 bits of an instruction are its opcode. No disassembler is needed, and none names the opcodes: the
listing gives them in hex, and ``--compare`` the ones whose counts differ (a change's new or vanished instructions,
e.g. a fence; their names come from a disassembly elsewhere, such as Nsight Compute's SASS view on a GPU).
``--words OPCODE`` (repeatable, e.g. 0x992) also lists the distinct 16-byte words of that opcode's instructions, so
that a change of an instruction's modifiers (a fence's scope) shows where its count does not.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
from collections import Counter

# the cluster builds of the three decode kernels, T=32768, D=128, bfloat16: (label, kernel file, kernel_defines
# options, pattern, its parameters)
BUILDS = (
    ("keys, window 4096, cluster 8", "decode_keys", dict(keys=True, cluster=8), "window", dict(window=4096)),
    ("rows, streaming 4+1024, cluster 8", "decode", dict(cluster=8), "streaming", dict(sink=4, window=1024)),
    ("rows on warpgroup MMA, bigbird, cluster 8", "decode", dict(cluster=8, wg=True), "bigbird",
     dict(block=64, window_blocks=3, global_blocks=1, random_blocks=3)),
)


def text_sections(cubin: bytes) -> dict[str, bytes]:
    """The ``.text.*`` sections of an ELF64 cubin, by name (``.text.`` and the kernel's)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not an ELF64 cubin")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]
    out = {}
    for name_off, _type, _flags, _addr, off, size, *_ in heads:
        name = cubin[names_at + name_off: cubin.index(b"\0", names_at + name_off)].decode()
        if name.startswith(".text."):
            out[name] = cubin[off: off + size]
    return out


def opcodes(text: bytes) -> Counter:
    """Opcode (the low 12 bits of each 16-byte instruction) -> count."""
    if len(text) % 16:
        raise ValueError(f"a .text section of {len(text)} bytes is not whole 16-byte instructions")
    return Counter(int.from_bytes(text[i: i + 8], "little") & 0xFFF for i in range(0, len(text), 16))


def words(text: bytes, wanted: set[int]) -> dict[str, list[str]]:
    """Opcode (of ``wanted``) -> the distinct instruction words (hex, in the section's byte order) that carry it."""
    out: dict[str, set[str]] = {}
    for i in range(0, len(text), 16):
        op = int.from_bytes(text[i: i + 8], "little") & 0xFFF
        if op in wanted:
            out.setdefault(f"0x{op:03x}", set()).add(text[i: i + 16].hex())
    return {k: sorted(v) for k, v in sorted(out.items())}


def listing(wanted: set[int] = frozenset()) -> list[dict]:
    from attnbench import compile as kc
    from attnbench import decode_config as dc
    from attnbench.patterns import make_mask

    out = []
    for label, name, opts, pattern, params in BUILDS:
        defines = dc.kernel_defines(128, "bfloat16", make_mask(pattern, 32768, True, **params), **opts)
        cubin, _ = kc._nvrtc(name, kc.source(name, defines), list(kc.options(defines)) + ["-arch=sm_90a"], defines)
        for section, text in sorted(text_sections(cubin).items()):
            out.append(dict(build=label, kernel=section[len(".text."):], instructions=len(text) // 16,
                            opcodes={f"0x{k:03x}": v for k, v in sorted(opcodes(text).items())},
                            words=words(text, wanted), words_for=[f"0x{w:03x}" for w in sorted(wanted)]))
    return out


def compare(a: list[dict], b: list[dict]) -> None:
    old = {(r["build"], r["kernel"]): r for r in a}
    for r in b:
        o = old.get((r["build"], r["kernel"]))
        if o is None:
            print(f"{r['build']} / {r['kernel']}: only in the second listing")
            continue
        diff = {k: (o["opcodes"].get(k, 0), r["opcodes"].get(k, 0))
                for k in sorted(set(o["opcodes"]) | set(r["opcodes"])) if o["opcodes"].get(k, 0) != r["opcodes"].get(k, 0)}
        what = ", ".join(f"{k} {x} -> {y}" for k, (x, y) in diff.items()) or "the same opcode counts"
        print(f"{r['build']} / {r['kernel']}: {o['instructions']} -> {r['instructions']} instructions; {what}")
        ow, nw = o.get("words", {}), r.get("words", {})
        # only the opcodes both listings were asked for (--words): a listing made without them has none
        both = set(o.get("words_for", ow)) & set(r.get("words_for", nw))
        for k in sorted(both):
            if ow.get(k, []) != nw.get(k, []):
                print(f"  {k} words: {' '.join(ow.get(k, [])) or '-'} -> {' '.join(nw.get(k, [])) or '-'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", nargs=2, metavar=("OLD_JSON", "NEW_JSON"))
    ap.add_argument("--words", action="append", default=[], metavar="OPCODE",
                    help="also list this opcode's distinct instruction words (hex, e.g. 0x992); repeatable")
    a = ap.parse_args(argv)
    try:
        wanted = {int(w, 16) for w in a.words}
    except ValueError:
        print(f"sass_opcodes: --words takes hex opcodes such as 0x992, not {' '.join(a.words)}", file=sys.stderr)
        return 2
    if a.compare:
        try:
            lists = [json.load(open(p)) for p in a.compare]
        except (OSError, ValueError) as e:
            print(f"sass_opcodes: {e}", file=sys.stderr)
            return 1
        compare(*lists)
        return 0
    try:
        got = listing(wanted)
    except KeyboardInterrupt:
        print("sass_opcodes: interrupted before the listing was complete; nothing written", file=sys.stderr)
        return 130
    json.dump(got, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
