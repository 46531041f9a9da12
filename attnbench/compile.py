"""Kernel loading: kernels/*.cu with compile-time constants injected as -D options.

The same source text and options go to ``cupy.RawModule`` on a GPU and, through
``compile_only``, to NVRTC without a device (for CI and ``attnbench compile``).
Local ``#include "x.cuh"`` lines (paths relative to kernels/) are expanded into the source text,
so the text that is compiled (and that CuPy's cache is keyed on) holds everything. The line
``#include "pattern.cuh"`` names the pattern compiled in: kernels/patterns/<name>.cuh of the
struct ``ab_<name>`` that the constant AB_PATTERN_T gives (``Mask.device_defines``).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*(//.*)?$', re.M)
PATTERN_INCLUDE = "pattern.cuh"
BASE_OPTIONS = ("-std=c++17",)


def kernel_dir() -> Path:
    here = Path(__file__).resolve().parent
    for d in (here.parent / "kernels", here / "kernels"):
        if (d / "common.cuh").is_file():
            return d
    raise FileNotFoundError(f"kernels/ not found beside {here}")


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (kernel_dir() / name).read_text()


def pattern_header(defines: dict) -> str:
    """The file ``#include "pattern.cuh"`` stands for: that of the struct AB_PATTERN_T."""
    struct = str(defines.get("AB_PATTERN_T", ""))
    if not struct.startswith("ab_"):
        raise BadInput(f"this kernel compiles a pattern in: AB_PATTERN_T must name one (ab_<pattern>), got {struct!r}")
    return f"patterns/{struct[3:]}.cuh"


def source(name: str, defines: dict | None = None) -> str:
    """The text of kernels/<name>.cu with its local includes expanded (once each), the pattern's
    header for ``#include "pattern.cuh"``."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def sub(m):
            inc = m.group(1)
            if inc == PATTERN_INCLUDE:
                inc = pattern_header(defines or {})
            if inc in seen:
                return ""
            seen.add(inc)
            return expand(_read(inc))
        return _INCLUDE.sub(sub, text)

    return expand(_read(f"{name}.cu"))


def options(defines: dict) -> tuple[str, ...]:
    """-D options: integers, and text (a pattern's struct and initialiser) as it is."""
    return BASE_OPTIONS + tuple(f"-D{k}={v if isinstance(v, str) else int(v)}" for k, v in sorted(defines.items()))


def round_up_pow2(n: int, minimum: int = 32) -> int:
    p = minimum
    while p < n:
        p *= 2
    return p


_MODULES: dict = {}


def get_module(name: str, defines: dict, arch: str | None = None):
    """A cupy.RawModule of kernels/<name>.cu compiled with these constants, cached per
    (source, options, device). ``arch`` names a target CuPy does not pick by itself (sm_90a for
    the wgmma kernels): the cubin is then built here through NVRTC and kept on disk under
    ``cache_dir()``, and a build short of registers is refused by name (``registers_refusal``; CuPy's own
    builds report ptxas' log as its CompileException)."""
    import cupy

    dev = cupy.cuda.Device()
    src = source(name, defines)
    opts = options(defines)
    key = (src, opts, dev.id, dev.compute_capability, arch)
    mod = _MODULES.get(key)
    if mod is None:
        if arch is None:
            mod = cupy.RawModule(code=src, options=opts, backend="nvrtc")
        else:
            mod = cupy.RawModule(path=str(_cached_cubin(name, src, opts, arch, defines)))
        _MODULES[key] = mod
    return mod


def resident_blocks(kernel, threads: int, smem: int) -> int:
    """Blocks of ``kernel`` (a RawModule's RawKernel, or the Function it wraps) that one
    multiprocessor of the current device holds at once with ``threads`` threads and ``smem``
    bytes of dynamic shared memory (registers and shared memory), as the driver says; at least 1."""
    from cupy_backends.cuda.api import driver

    func = getattr(kernel, "kernel", kernel)  # RawKernel.kernel: the cupy.cuda.Function with the handle
    return max(1, int(driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, threads, smem)))


def cache_dir() -> Path:
    """Where cubins built for an explicit arch are kept: $ATTNBENCH_CACHE_DIR, else
    ~/.cache/attnbench."""
    import os

    return Path(os.environ.get("ATTNBENCH_CACHE_DIR") or Path.home() / ".cache" / "attnbench")


def _cached_cubin(name: str, src: str, opts: tuple, arch: str, defines: dict | None = None) -> Path:
    import hashlib
    import os

    from cupy.cuda import nvrtc

    key = "\0".join((src, *opts, arch, repr(nvrtc.getVersion())))
    path = cache_dir() / f"{name}-{arch}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.cubin"
    if not path.is_file():
        cubin, _ = _nvrtc(name, src, list(opts) + [f"-arch={arch}"], defines)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)  # atomic: concurrent processes never read half a file
    return path


_SHORT_OF_REGISTERS = re.compile(r"Insufficient registers \((\d+)\).*?register target of (\d+)", re.S)


def registers_refusal(name: str, defines: dict, log: str) -> BadInput | None:
    """BadInput naming the shape's warps and blocks per multiprocessor where ptxas' ``log`` says the
    registers they leave a thread are too few for the build (e.g. 8 warps at MINB=4: 64 a thread); None
    for any other failure."""
    m = _SHORT_OF_REGISTERS.search(log)
    if not m:
        return None
    have, need = map(int, m.groups())
    warps, minb = defines.get("NWARPS"), defines.get("MINB")
    shape = (f"NWARPS={warps} and MINB={minb} ({warps} x 32 threads x {minb} blocks a multiprocessor)"
             if warps is not None and minb is not None else "its launch bounds")
    return BadInput(f"{name}.cu: {shape} leave {have} registers a thread, and this build needs at least {need} "
                    f"(ptxas); take fewer warps or a lower MINB")


def _nvrtc(name: str, src: str, opts: list[str], defines: dict | None = None) -> tuple[bytes, str]:
    """(cubin, log) of NVRTC on this source; BadInput where the shape leaves a thread too few registers
    (``registers_refusal``), RuntimeError with the log for any other failure."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(src, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            refusal = registers_refusal(name, defines or {}, log)
            if refusal is not None:
                raise refusal from e
            raise RuntimeError(f"{name}.cu failed with {' '.join(opts)}:\n{log}") from e
        return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)


def ptx(name: str, defines: dict, arch: str) -> str:
    """The PTX NVRTC makes of a kernel source with these -D constants for ``arch`` (sm_XX[a])."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(source(name, defines), f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, list(options(defines)) + [f"-arch={arch.replace('sm_', 'compute_')}"])
        text = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return text.decode().rstrip("\x00") if isinstance(text, bytes) else text


@dataclass
class KernelReport:
    source: str
    kernel: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    smem: int
    cubin_sha256: str = ""  # of the whole module's cubin (every kernel of one source shares it)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str, source_name: str) -> list[KernelReport]:
    out: list[KernelReport] = []
    cur = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = KernelReport(source_name, m.group(1), m.group(2), 0, 0, 0, 0, 0)
            out.append(cur)
            continue
        if cur is None:
            continue
        m = _SPILL.search(line)
        if m:
            cur.stack, cur.spill_stores, cur.spill_loads = map(int, m.groups())
        m = _REGS.search(line)
        if m:
            cur.registers = int(m.group(1))
            s = _SMEM.search(line)
            cur.smem = int(s.group(1)) if s else 0
    return out


def compile_only(name: str, defines: dict, arch: str) -> list[KernelReport]:
    """Compile kernels/<name>.cu to a cubin for ``arch`` (e.g. sm_90) through NVRTC, with no
    device; return ptxas' per-kernel report. Raises RuntimeError with the compiler log (BadInput where the
    shape leaves a thread too few registers: ``registers_refusal``), and where the log names no kernel (a report
    nobody could check for spills)."""
    check_arch(arch)
    import hashlib

    cubin, log = _nvrtc(name, source(name, defines), list(options(defines)) + [f"-arch={arch}", "-Xptxas=-v"],
                        defines)
    digest = hashlib.sha256(cubin).hexdigest()
    reports = parse_ptxas(log, name)
    if not reports:
        raise RuntimeError(f"{name} for {arch}: ptxas reported no kernel (its -v log, below, did not parse)\n{log}")
    for r in reports:
        r.cubin_sha256 = digest
    return reports


# the oldest target each kernel family builds for, and why (older targets are refused by name)
MIN_SM = {"fast_tc": (80, "mma.sync on bfloat16 and cp.async need sm_80 or newer"),
          "fast_tc_bwd": (80, "mma.sync on bfloat16 and cp.async need sm_80 or newer"),
          "fast_tc_bwd_wg": (90, "its products are Hopper's warpgroup MMA (wgmma, sm_90a)"),
          "fast_tc_bwd_dq_wg": (90, "its products are Hopper's warpgroup MMA (wgmma, sm_90a)"),
          "fast_f32": (80, "cp.async needs sm_80 or newer")}


def check_arch(arch: str) -> str:
    """The arch as given, when it looks like sm_80 or sm_90a; BadInput otherwise."""
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise BadInput(f"arch={arch!r} must look like sm_80 or sm_90")
    return arch


def unbuildable(name: str, arch: str) -> str | None:
    """Why kernels/<name>.cu cannot build for ``arch`` (None: it can)."""
    sm, why = MIN_SM.get(name, (0, ""))
    return f"{name} is not built for {arch}: {why}" if int(re.sub(r"\D", "", arch)) < sm else None


def target_arch(defines: dict, arch: str) -> str | None:
    """The target a build compiles for when ``arch`` is asked: the wgmma builds (WG=1) need
    sm_90a, so they compile for it under sm_90 and not at all under other archs (None)."""
    if defines.get("WG"):
        return "sm_90a" if arch in ("sm_90", "sm_90a") else None
    return arch


def standard_builds() -> list[tuple[str, dict]]:
    """(source, constants) for every kernel at the standard configurations (SPEC section 5): the
    tile-list expansion, the document lists, the bandwidth probe, the tile classification, the class-major
    copy, and each
    implementation module's own ``standard_builds``."""
    import importlib

    from .impls import MODULES

    builds: list[tuple[str, dict]] = []
    for name in ("tiles", "document_tiles", "timing", "classify", "classes") + MODULES:
        mod = importlib.import_module(f"{__package__}.{name}")
        for b in getattr(mod, "standard_builds", list)():
            if b not in builds:
                builds.append(b)
    return builds
