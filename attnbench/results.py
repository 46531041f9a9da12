"""Tidy result rows: one per (configuration, implementation), provenance in every row.

Rows are appended and flushed as each configuration finishes, so an interrupted sweep keeps
every finished row, and ``--resume`` skips the (configuration, implementation) pairs that a
CSV already holds.
"""
from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import subprocess
from pathlib import Path

from .patterns import BadInput

COLUMNS = [
    "timestamp", "gpu", "sm_count", "driver", "cuda_runtime", "cupy", "torch", "git_commit",
    "config", "command", "impl", "family", "pattern", "label", "causal", "window", "sink", "block",
    "dilation", "params", "B", "H", "T", "D", "dtype", "pairs", "density", "flops", "bytes_floor",
    "status", "reason", "rel_err", "tolerance", "median_ms", "p20_ms", "p80_ms", "samples",
    "tflops", "peak_tflops", "peak_tbps", "floor_ms", "roofline", "compile_s", "setup_s",
]
STATUSES = ("ok", "failed", "skipped")
# the columns that name a (configuration, implementation) pair
KEY_COLUMNS = ("impl", "pattern", "params", "causal", "B", "H", "T", "D", "dtype")
PATTERN_PARAM_COLUMNS = ("window", "sink", "block", "dilation")


def params_json(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def _norm(col: str, v) -> str:
    if col == "causal":
        return str(v).strip().lower() in ("true", "1")
    if col in ("B", "H", "T", "D"):
        return int(float(v))
    if col == "params":
        return params_json(json.loads(v)) if isinstance(v, str) else params_json(v)
    return str(v)


def row_key(row: dict) -> tuple:
    """The identity of a row, the same whether it comes from a dict just built or a CSV."""
    return tuple(_norm(c, row[c]) for c in KEY_COLUMNS)


# -- provenance -----------------------------------------------------------------------

def git_commit(path: str | os.PathLike | None = None) -> str:
    """The commit of the working tree holding ``path`` (this package by default), ``-dirty``
    when tracked files are modified. A copy of the tree without its git metadata (a GPU
    machine that gets the files only) takes it from ATTNBENCH_GIT_COMMIT; else ``unknown``."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent
    given = os.environ.get("ATTNBENCH_GIT_COMMIT", "").strip()
    if given:
        return given
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=where, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _version(pkg: str) -> str:
    from importlib import metadata

    for name in (pkg, f"{pkg}-cuda13x", f"{pkg}-cuda12x"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _driver_version() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    import cupy

    return "cuda " + _cuda_version(cupy.cuda.runtime.driverGetVersion())


def provenance(device: int | None = None) -> dict:
    """GPU, driver, runtime, library versions and git commit (the columns shared by every row
    of a run; ``timestamp`` is set when each row is written)."""
    import cupy

    dev = cupy.cuda.Device() if device is None else cupy.cuda.Device(device)
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    return {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "sm_count": int(props["multiProcessorCount"]),
        "driver": _driver_version(),
        "cuda_runtime": _cuda_version(cupy.cuda.runtime.runtimeGetVersion()),
        "cupy": cupy.__version__,
        "torch": _version("torch"),
        "git_commit": git_commit(),
    }


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- writing and reading --------------------------------------------------------------

def read_header(path: Path) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f), [])


class ResultWriter:
    """Appends rows to a CSV, flushed to disk as each configuration finishes."""

    def __init__(self, path: str | os.PathLike, resume: bool = False, overwrite: bool = False):
        self.path = Path(path)
        self.done: set[tuple] = set()
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not (resume or overwrite):
            raise BadInput(f"{self.path} exists: pass --resume to continue it or --overwrite to replace it")
        if exists and resume:
            header = read_header(self.path)
            if header != COLUMNS:
                missing = [c for c in COLUMNS if c not in header]
                raise BadInput(f"{self.path} has other columns than this version writes "
                               f"(missing: {', '.join(missing) or 'none'}): cannot resume it")
            with open(self.path, newline="") as f:
                self.done = {row_key(r) for r in csv.DictReader(f)}
            self._f = open(self.path, "a", newline="")
            self._w = csv.DictWriter(self._f, fieldnames=COLUMNS)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w", newline="")
            self._w = csv.DictWriter(self._f, fieldnames=COLUMNS)
            self._w.writeheader()
            self._sync()

    def is_done(self, row: dict) -> bool:
        return row_key(row) in self.done

    def write(self, rows: list[dict]) -> None:
        for row in rows:
            key = row_key(row)
            if key in self.done:
                continue
            unknown = set(row) - set(COLUMNS)
            if unknown:
                raise ValueError(f"unknown columns {sorted(unknown)}")
            self._w.writerow({c: _cell(row.get(c)) for c in COLUMNS})
            self.done.add(key)
        self._sync()

    def _sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if v == v else "nan"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


NUMERIC = ("median_ms", "p20_ms", "p80_ms", "tflops", "roofline", "rel_err", "tolerance", "floor_ms")
INTEGER = ("B", "H", "T", "D")


def read_results(path: str | os.PathLike):
    """The rows of a results CSV as a pandas DataFrame; BadInput when the file is missing, is
    not a results CSV, or holds a row cut short or a value of the wrong kind (naming the
    column and line). B, H, T and D come back as integers."""
    import pandas as pd

    p = Path(path)
    if p.is_dir():
        raise BadInput(f"results CSV {p} is a directory")
    if not p.is_file():
        raise BadInput(f"results CSV {p} does not exist" if not p.exists() else
                       f"results CSV {p} is not a regular file")
    try:
        raw = p.read_bytes()
        df = pd.read_csv(p, keep_default_na=False, na_values=[""], dtype={"reason": str, "git_commit": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise BadInput(f"{p} is not a results CSV: {e}") from None
    except OSError as e:
        raise BadInput(f"results CSV {p} cannot be read: {e.strerror}") from None
    if not raw.endswith(b"\n"):
        last = raw.count(b"\n") + 1
        raise BadInput(f"{p} line {last} is cut short (no newline at its end): "
                       f"`attnbench sweep --resume` sets it aside")
    needed = ["impl", "family", "pattern", "label", "causal", "B", "H", "T", "D", "dtype", "status", "median_ms"]
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise BadInput(f"{p} is not a results CSV: missing columns {', '.join(missing)}")
    _check_cells(df, p)
    df["causal"] = df["causal"].map(lambda v: str(v).strip().lower() in ("true", "1"))
    if "params" in df.columns:  # one spelling of each pattern instance, whoever wrote the row
        df["label"] = [_label(pat, ps, lab) for pat, ps, lab in zip(df["pattern"], df["params"], df["label"])]
    return df


def _check_cells(df, p: Path) -> None:
    """Refuse rows cut short or with a value of the wrong kind; integers as ``int``."""
    import pandas as pd

    def line(i) -> int:  # the header is line 1 (a row spanning lines shifts this a little)
        return int(i) + 2

    bad = df.index[~df["status"].isin(STATUSES)]
    if len(bad):
        v = df.at[bad[0], "status"]
        what = "is empty" if pd.isna(v) else f"{v!r} is not one of {', '.join(STATUSES)}"
        raise BadInput(f"{p} line {line(bad[0])}: column status {what} (a row cut short? "
                       f"`attnbench sweep --resume` sets such rows aside)")
    for col in INTEGER + NUMERIC:
        if col not in df.columns:
            continue
        num = pd.to_numeric(df[col], errors="coerce")
        wrong = df.index[num.isna() & df[col].notna()]
        if col in INTEGER:
            wrong = df.index[num.isna() | (num != num.round())]
        if len(wrong):
            v = df.at[wrong[0], col]
            raise BadInput(f"{p} line {line(wrong[0])}: column {col} holds "
                           f"{'nothing' if pd.isna(v) else repr(v)}, not {'an integer' if col in INTEGER else 'a number'}")
        df[col] = num.astype("int64") if col in INTEGER else num.astype(float)


def _label(pattern, params, fallback):
    from .patterns import PATTERNS, pattern_label

    try:
        return pattern_label(pattern, json.loads(params)) if pattern in PATTERNS else fallback
    except (TypeError, ValueError):
        return fallback
