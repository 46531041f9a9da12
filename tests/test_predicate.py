"""The row-at-a-time predicate (ab_allowed_bits, the partial tiles of fast-tc) against the
pattern's own definition, bit for bit: a wrong key in one row would hide under the gate's norm."""
import shutil
import subprocess

import numpy as np
import pytest

from attnbench import compile as kc
from attnbench.compile import compile_only
from attnbench.patterns import examples, make_mask

T = 320
CASES = list(examples(T))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_predicate_kernel_compiles(arch):
    defines = make_mask("streaming", T).device_defines(runtime=True)
    assert [r.kernel for r in compile_only("predicate", defines, arch)] == ["predicate_bits"]


def check_bits(mask, truth=None):
    """The device predicate of ``mask`` (both forms) against ``truth`` (its numpy mask by default),
    bit for bit, on a GPU."""
    import cupy

    from attnbench.compile import get_module

    T, causal = mask.T, mask.causal
    nw = -(-T // 16) + 1  # one word starting at or past T
    fast = cupy.zeros((T, nw), dtype=cupy.uint32)
    ref = cupy.zeros((T, nw), dtype=cupy.uint32)
    table = cupy.asarray(mask.table if mask.table is not None else np.zeros(1, np.int32), dtype=cupy.int32)
    kern = get_module("predicate", mask.device_defines(runtime=True)).get_function("predicate_bits")
    pargs = cupy.asarray(mask.device_args())
    kern((T,), (64,), (np.int32(causal), pargs, table, np.int32(T), np.int32(nw), fast, ref))
    fast, ref = fast.get(), ref.get()
    # the truth: the pattern's numpy mask, packed the same way
    dense = np.zeros((T, 16 * nw + 32), dtype=bool)
    dense[:, :T] = mask.dense() if truth is None else truth
    bits = np.zeros((T, nw), dtype=np.uint64)
    for b in range(32):
        bits |= dense[:, 16 * np.arange(nw) + b].astype(np.uint64) << np.uint64(b)
    assert (ref == bits).all()
    in_seq = np.array([sum(1 << b for b in range(32) if 16 * w + b < T) for w in range(nw)], dtype=np.uint64)
    assert (fast & in_seq == bits).all()
    if causal:  # keys past the row, hence past T, are never set
        assert (fast == bits).all()


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,causal,params", CASES, ids=[f"{c[0]}-{'c' if c[1] else 'nc'}-{i}" for i, c in enumerate(CASES)])
def test_bits_match_the_pattern(pattern, causal, params):
    check_bits(make_mask(pattern, T, causal, **params))


# ---- dilated's words in closed form (kernels/patterns/dilated.cuh, level_bits) ------------------------
# Each level's word is its constant word ab_every(r) (bits 0, r, 2r, ...) shifted by the row's residue
# rr mod r, rr = i - j0, within the level's reach: the device code itself, built on the host with g++, against
# the plain predicate. Levels below, at and past 32
# keys a word, powers of two (a mask) and others (a division), rows behind and ahead of the word.
LEVEL_RS = (1, 2, 3, 4, 5, 8, 16, 31, 32, 33, 64)
LEVEL_SETS = ([((W, r),) for r in LEVEL_RS for W in (1, 3, 9)] +
              [((40, 1), (40, 2), (40, 4)), ((6, 2), (4, 4), (8, 1)), ((5, 3), (4, 5), (3, 33)),
               ((9, 31), (2, 32), (3, 64), (20, 1)), ((1, 1), (7, 8), (3, 16)), tuple((3, r) for r in LEVEL_RS[:9])])
ROWS, STARTS = 400, 460  # rows 0 .. ROWS - 1 against words j0 = 0 .. STARTS - 1 (j0 > i: keys ahead)


def level_set_mask(levels, causal, T=ROWS):
    (W, r), extra = levels[0], tuple(levels[1:])
    return make_mask("dilated", T, causal, window=W, dilation=r, levels=extra)


def truth_words(mask, rows, starts):
    """allowed(i, j0 + b), the causal clause included, as bit b of word [i, j0] (keys past T too)."""
    i, j0, b = rows[:, None, None], starts[None, :, None], np.arange(32)[None, None, :]
    ok = mask.pattern.allowed(i, j0 + b, mask.T, mask.causal, mask.params, None)
    if mask.causal:
        ok = ok & (j0 + b <= i)
    return (ok.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=2, dtype=np.uint64)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_ab_every_gives_every_rth_bit(tmp_path):
    """kernels/common.cuh's ab_every(r), the word of every r-th bit that dilated's words shift, built with g++."""
    from test_expr_bits import host_common

    (tmp_path / "common.cuh").write_text(host_common())
    (tmp_path / "main.cpp").write_text('#include "common.cuh"\n#include <cstdio>\n'
                                       "int main() { for (int r = 1; r < 70; ++r) printf(\"%u\\n\", ab_every(r)); }\n")
    exe = tmp_path / "every"
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-Wno-unknown-pragmas", "-o", str(exe), str(tmp_path / "main.cpp")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == [sum(1 << b for b in range(0, 32, r)) for r in range(1, 70)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_dilated_device_words_on_the_host_are_the_predicate(tmp_path):
    """kernels/patterns/dilated.cuh's bits through ab_allowed_bits, compiled with g++ (the device
    helpers as test_expr_bits builds them), every level set above, both causal flags."""
    from test_expr_bits import host_common

    masks = [level_set_mask(levels, causal) for levels in LEVEL_SETS for causal in (True, False)]
    (tmp_path / "common.cuh").write_text(host_common())
    funcs = "\n".join(f"static unsigned f{n}(int i, int j0) {{ const ab_dilated p{{{m.device_defines()['AB_PATTERN_ARGS']}}}; "
                      f"return ab_allowed_bits(p, i, j0); }}" for n, m in enumerate(masks))
    (tmp_path / "main.cpp").write_text(
        f'#include "{kc.kernel_dir() / "patterns" / "dilated.cuh"}"\n{funcs}\n'
        f"static unsigned (*fs[])(int, int) = {{{', '.join(f'f{n}' for n in range(len(masks)))}}};\n"
        "#include <cstdio>\nint main() {\n"
        f"  for (auto f : fs) for (int i = 0; i < {ROWS}; ++i) for (int j0 = 0; j0 < {STARTS}; ++j0) {{\n"
        "    unsigned w = f(i, j0); fwrite(&w, 4, 1, stdout); }\n  return 0;\n}\n")
    exe = tmp_path / "bits"
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-Wno-unknown-pragmas", "-Wno-missing-braces", f"-I{tmp_path}",
                        "-o", str(exe), str(tmp_path / "main.cpp")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = np.frombuffer(subprocess.run([str(exe)], check=True, capture_output=True).stdout, dtype=np.uint32)
    out = out.reshape(len(masks), ROWS, STARTS)
    for n, m in enumerate(masks):
        want = truth_words(m, np.arange(ROWS), np.arange(STARTS))
        bad = np.argwhere(out[n] != want)
        assert not bad.size, (m.label(), m.causal, bad[0])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_dilated_level_words_on_the_device(causal):
    """The same level sets through predicate.cu (parameters at run time), at an odd T."""
    for levels in LEVEL_SETS:
        check_bits(level_set_mask(levels, causal, T=333))
