"""scripts/sass_opcodes.py: the cubin's instructions by opcode, through NVRTC (no GPU)."""
import json
import subprocess
import sys

import pytest
from scriptmod import ROOT, script

so = script("sass_opcodes")

KERNEL = """extern "C" __global__ void k(float* x) {
    x[threadIdx.x] = 1.f;
    FENCE
    x[threadIdx.x + 32] = 2.f;
}"""


def _cubin(fence: str) -> bytes:
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(KERNEL.replace("FENCE", fence), "k.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=sm_90a"])
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def test_a_kernels_text_is_whole_instructions_and_a_fence_adds_opcodes():
    plain, fenced = (so.text_sections(_cubin(f)) for f in ("", "__threadfence();"))
    assert set(plain) == set(fenced) == {".text.k"}
    a, b = plain[".text.k"], fenced[".text.k"]
    assert len(a) % 16 == 0 and len(a) > 0
    ops_a, ops_b = so.opcodes(a), so.opcodes(b)
    assert sum(ops_a.values()) == len(a) // 16 and sum(ops_b.values()) == len(b) // 16
    new = {op for op in ops_b if ops_b[op] > ops_a.get(op, 0)}
    assert new, (ops_a, ops_b)  # the fence's instructions
    words = so.words(b, new)
    assert set(words) == {f"0x{op:03x}" for op in new}
    assert all(len(w) == 32 and f"0x{int.from_bytes(bytes.fromhex(w)[:8], 'little') & 0xFFF:03x}" == op
               for op, ws in words.items() for w in ws)


def test_what_is_not_a_cubin_or_whole_instructions_is_refused():
    with pytest.raises(ValueError, match="ELF64"):
        so.text_sections(b"not a cubin at all, but long enough" * 4)
    with pytest.raises(ValueError, match="16-byte"):
        so.opcodes(b"\0" * 24)


def test_compare_names_the_opcodes_and_words_that_changed(tmp_path, capsys):
    old = [dict(build="b", kernel="k", instructions=3, opcodes={"0x992": 1, "0x9ab": 1, "0x918": 1},
                words={"0x992": ["aa"]})]
    new = [dict(build="b", kernel="k", instructions=3, opcodes={"0x992": 1, "0x3c6": 1, "0x918": 1},
                words={"0x992": ["bb"]}),
           dict(build="b", kernel="other", instructions=1, opcodes={"0x918": 1}, words={})]
    so.compare(old, new)
    out = capsys.readouterr().out
    assert "b / k: 3 -> 3 instructions; 0x3c6 0 -> 1, 0x9ab 1 -> 0" in out
    assert "0x992 words: aa -> bb" in out and "b / other: only in the second listing" in out
    p, q = tmp_path / "old.json", tmp_path / "new.json"
    p.write_text(json.dumps(old))
    q.write_text(json.dumps(old))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_opcodes.py"), "--compare", str(p), str(q)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "the same opcode counts" in r.stdout and "words" not in r.stdout


def test_bad_options_exit_with_the_reason():
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_opcodes.py"), *a],  # noqa: E731
                                    capture_output=True, text=True)
    r = run("--words", "zz")
    assert r.returncode == 2 and "--words takes hex opcodes" in r.stderr
    r = run("--compare", "/nonexistent/a.json", "/nonexistent/b.json")
    assert r.returncode == 1 and "sass_opcodes:" in r.stderr
