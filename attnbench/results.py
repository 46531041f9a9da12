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
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput
from .patterns import param_columns

# the pattern parameter columns come from the registry (Param.column), in its order
COLUMNS = [
    "timestamp", "gpu", "sm_count", "driver", "cuda_runtime", "cupy", "torch", "git_commit",
    "config", "command", "impl", "family", "pattern", "label", "causal", *param_columns(),
    "params", "B", "H", "T", "D", "dtype", "pairs", "density", "flops", "bytes_floor",
    "status", "reason", "rel_err", "tolerance", "median_ms", "p20_ms", "p80_ms", "samples",
    "tflops", "peak_tflops", "peak_tbps", "floor_ms", "roofline", "compile_s", "setup_s",
]
STATUSES = ("ok", "failed", "skipped")
# the columns that name a (configuration, implementation) pair
KEY_COLUMNS = ("impl", "pattern", "params", "causal", "B", "H", "T", "D", "dtype")
# columns added after files were written, and what a row of an older file (or an empty cell) holds
# there: a value, or the value of another column of the same row (Same("H")). Such a file reads
# back with them and is rewritten with them before it is resumed.


class Same(str):
    """The value of the named column of the same row (``ADDED``)."""


ADDED = {
    "pass": "fwd",          # the pass axis (impls.PASSES)
    "H_kv": Same("H"),      # serving shapes (SPEC section 1): a row without them is prefill
    "Tq": Same("T"),
    "cache_lens": "",
    "peak_mem_mb": "",      # device memory beyond inputs and outputs (attnbench.memory): not measured before
}
# columns of ADDED that are measurements, not part of a row's identity
MEASURED = ("peak_mem_mb",)
COLUMNS += list(ADDED)
KEY_COLUMNS += tuple(c for c in ADDED if c not in MEASURED)


def params_json(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def params_from_json(pattern: str, text) -> dict:
    """A row's params column back as the pattern takes them: each declared parameter through its
    ``Param.value`` (JSON gives lists where the pattern holds tuples); others as they are."""
    from .patterns import PATTERNS

    given = json.loads(text) if isinstance(text, str) else dict(text or {})
    pat = PATTERNS.get(pattern)
    if pat is None:
        return given
    kinds = {q.name: q for q in pat.params}
    return {k: (kinds[k].value(v) if k in kinds else v) for k, v in given.items()}


def _norm(col: str, v, pattern: str = "") -> str:
    if col == "causal":
        return str(v).strip().lower() in ("true", "1")
    if col in ("B", "H", "T", "D", "H_kv", "Tq"):
        return int(float(v))
    if col == "cache_lens":
        return ",".join(str(int(float(x))) for x in str(v).split(",") if x.strip())
    if col == "params":
        from .patterns import PATTERNS

        given = json.loads(v) if isinstance(v, str) else dict(v)
        # the pattern's defaults under what the row gives: a row written before a parameter was
        # declared (dilated's levels) is the same instance as one written after, at its default
        defaults = json.loads(params_json(PATTERNS[pattern].defaults())) if pattern in PATTERNS else {}
        return params_json({**defaults, **given})
    return str(v)


def row_key(row: dict) -> tuple:
    """The identity of a row, the same whether it comes from a dict just built or a CSV."""
    return tuple(_norm(c, _value(row, c), str(row.get("pattern", ""))) for c in KEY_COLUMNS)


def _value(row: dict, col: str):
    """``row[col]``; for a column of ADDED that a row lacks or leaves empty, the value an older row
    takes there."""
    if col not in ADDED:
        return row[col]
    v = row.get(col)
    if v is None or (isinstance(v, float) and v != v) or (isinstance(v, str) and not v.strip()):
        d = ADDED[col]
        return row[d] if isinstance(d, Same) else d
    return v


def with_added(row: dict) -> dict:
    """A row of an older file with the columns of ADDED filled in."""
    return {**row, **{c: _value(row, c) for c in ADDED}}


class Tally(Counter):
    """Counts by status (and ``resumed``), with the reasons of the rows not ``ok``."""

    def __init__(self):
        super().__init__({"ok": 0, "failed": 0, "skipped": 0, "resumed": 0})
        self.reasons: dict[str, Counter] = {"failed": Counter(), "skipped": Counter()}

    def add(self, status: str, reason: str = "") -> None:
        self[status] += 1
        if status in self.reasons:
            self.reasons[status][reason or "no reason given"] += 1

    @property
    def checked(self) -> int:
        return self["ok"] + self["failed"]

    def summary(self) -> str:
        """``checked 12, passed 12, failed 0, skipped 30`` (and ``resumed N`` when any)."""
        s = f"checked {self.checked}, passed {self['ok']}, failed {self['failed']}, skipped {self['skipped']}"
        return s + (f", resumed {self['resumed']}" if self["resumed"] else "")

    def reason_lines(self, most: int = 8) -> list[str]:
        """The reasons of the failed, then skipped rows, most frequent first, with counts."""
        out = []
        for status, reasons in self.reasons.items():
            ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
            out += [f"  {status} {n}x: {why}" for why, n in ranked[:most]]
            if len(ranked) > most:
                out.append(f"  {status}: {len(ranked) - most} other reasons")
        return out


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

@dataclass
class Record:
    """One CSV record of a results file: where it starts, its text as stored, its row."""
    line: int
    text: str
    row: dict | None = None
    key: tuple | None = None
    problem: str = ""  # why it cannot be taken as a row (empty: a good row)


def _lines(text: str):
    parts = text.split("\n")
    for n, part in enumerate(parts):
        if n < len(parts) - 1:
            yield part + "\n"
        elif part:
            yield part  # the last line, cut short: no newline


def scan(path: Path) -> tuple[list[str], list[Record]]:
    """The header and every record of a results CSV, each record judged: a record is good when
    it ends with a newline, has one field per column and a key that parses."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise BadInput(f"results CSV {path} cannot be read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path} is not a results CSV (not UTF-8 text at byte {e.start})") from None
    lines = list(_lines(text))
    records: list[Record] = []
    reader = csv.reader(iter(lines))
    first, header = 0, []
    try:
        for fields in reader:
            chunk = "".join(lines[first:reader.line_num])
            start, first = first + 1, reader.line_num
            if not records and not header:
                header = fields
                continue
            records.append(_judge(Record(start, chunk), fields, header))
    except csv.Error as e:  # e.g. a NUL byte: this record and the rest are not rows
        records.append(Record(first + 1, "".join(lines[first:]), problem=f"unreadable ({e})"))
    return header, records


def _judge(rec: Record, fields: list[str], header: list[str]) -> Record:
    if not fields:
        rec.problem = "blank"
    elif not rec.text.endswith("\n"):
        rec.problem = "cut short (no newline at its end)"
    elif len(fields) != len(header):
        rec.problem = f"{len(fields)} fields where the header has {len(header)}"
    else:
        rec.row = dict(zip(header, fields))
        try:
            rec.key = row_key(rec.row)
            if rec.row.get("status") not in STATUSES:
                raise ValueError(f"status {rec.row.get('status')!r}")
        except (KeyError, TypeError, ValueError) as e:
            rec.row, rec.key, rec.problem = None, None, f"not a row ({e})"
    return rec


def superseded(records: list[Record]) -> set[int]:
    """Indices of ``failed`` rows that a later row of the same key replaces (rows that
    --retry-failed ran again)."""
    last = {}
    for n, r in enumerate(records):
        if r.key is not None:
            last[r.key] = n
    return {n for n, r in enumerate(records)
            if r.key is not None and last[r.key] != n and r.row["status"] == "failed"}


class ResultWriter:
    """Appends rows to a CSV, flushed to disk as each configuration finishes.

    Creating one only looks: it refuses what it could not do (an existing file without
    ``resume`` or ``overwrite``, a CSV of other columns, a path it cannot write) and changes
    nothing. ``open()`` (or ``with``) prepares the file:

    * a new file, or one to ``overwrite``: rows go to a temporary file beside it that replaces
      it atomically when the first rows arrive; until then the old file is untouched, and a run
      that writes no row leaves it (or its absence) as it was;
    * ``resume``: records that are not whole rows (a line cut short by a killed run or a full
      disk, a line of other fields) are appended to ``<csv>.partial`` with a warning naming
      their line, and dropped from the file (rewritten through a temporary file); rows are then
      appended. With ``retry_failed``, ``failed`` rows do not count as done: the rows run again
      are appended and, on ``close()``, the failed rows they replace are dropped (again through
      a temporary file; a run cut short leaves both, and the next resume drops the old one).
    """

    def __init__(self, path: str | os.PathLike, resume: bool = False, overwrite: bool = False,
                 retry_failed: bool = False, warn=None):
        from .safefile import probe, target

        self.path = Path(path)
        self.resume, self.retry_failed = resume, retry_failed
        self.warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
        self.done: set[tuple] = set()
        self.gpus: dict[str, int] = {}
        self._f = self._temp = None
        self._opened = False
        self._records: list[Record] | None = None
        if retry_failed and not resume:
            raise BadInput("--retry-failed reruns the failed rows of a CSV: it needs --resume")
        target(self.path, "results CSV")
        exists = self.path.exists() and self.path.stat().st_size > 0 and not _header_only(self.path)
        if exists and not (resume or overwrite):
            raise BadInput(f"{self.path} exists: pass --resume to continue it or --overwrite to replace it")
        if exists and resume:
            header, self._records = scan(self.path)
            if header != COLUMNS and not _upgradable(header):
                missing = [c for c in COLUMNS if c not in header]
                raise BadInput(f"{self.path} has other columns than this version writes "
                               f"(missing: {', '.join(missing) or 'none'}): cannot resume it")
            gone = superseded(self._records)
            for n, r in enumerate(self._records):
                if r.key is None or n in gone:
                    continue
                if not (retry_failed and r.row["status"] == "failed"):
                    self.done.add(r.key)
                gpu = r.row.get("gpu", "")
                if gpu:
                    self.gpus[gpu] = self.gpus.get(gpu, 0) + 1
        else:
            probe(self.path, "results CSV")

    def check_gpu(self, gpu: str) -> None:
        """Refuse to add rows of ``gpu`` to a CSV holding rows of another GPU."""
        others = {g: n for g, n in self.gpus.items() if g != gpu}
        if others:
            held = ", ".join(f"{n} rows of {g!r}" for g, n in sorted(others.items()))
            raise BadInput(f"{self.path} holds {held}; this GPU is {gpu!r}: resume it on that GPU, "
                           f"or write this one's rows to another --out")

    def open(self) -> "ResultWriter":
        if self._opened:
            return self
        self._opened = True
        if self._records is None:
            return self  # a fresh file: made when the first rows arrive
        bad = [r for r in self._records if r.problem and r.problem != "blank"]
        if bad:
            self._set_aside(bad)
        self._rewrite(set_aside=len(bad))
        self._upgrade()
        self._f = self._io(lambda: open(self.path, "a", newline=""))
        self._w = csv.DictWriter(self._f, fieldnames=COLUMNS)
        return self

    def _io(self, fn):
        try:
            return fn()
        except OSError as e:
            raise BadInput(f"results CSV {self.path} cannot be written: {e.strerror}") from None

    def _set_aside(self, bad: list[Record]) -> None:
        aside = self.path.with_name(self.path.name + ".partial")

        def save():
            with open(aside, "a", newline="") as f:
                for r in bad:
                    f.write(r.text if r.text.endswith("\n") else r.text + "\n")
                f.flush()
                os.fsync(f.fileno())
        self._io(save)
        for r in bad:
            self.warn(f"{self.path} line {r.line} is not a whole row: {r.problem}; set aside in {aside}, "
                      f"its configuration runs again")

    def _rewrite(self, set_aside: int = 0) -> None:
        """Replace the file by its header and its good rows, less the superseded failed ones
        (when there is anything to leave out)."""
        from .safefile import write_atomically

        header, records = scan(self.path)
        gone = superseded(records)
        bad = [r for r in records if r.problem and r.problem != "blank"]
        if len(bad) > set_aside:  # never drop a record that was not saved aside
            raise BadInput(f"{self.path} changed while this sweep ran: not rewritten")
        if not (bad or gone or any(r.problem for r in records)):
            return
        keep = [r.text for n, r in enumerate(records) if r.key is not None and n not in gone]

        def write(f):
            csv.writer(f).writerow(header)
            f.write("".join(keep))
        write_atomically(self.path, write, what="results CSV")
        self._records = None

    def _upgrade(self) -> None:
        """A file of an older version (columns of ADDED missing): its rows rewritten under this
        version's header, the missing columns at the value an older row takes."""
        from .safefile import write_atomically

        header, records = scan(self.path)
        if header == COLUMNS:
            return
        rows = [with_added(r.row) for r in records if r.row is not None]

        def write(f):
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        write_atomically(self.path, write, what="results CSV")
        self.warn(f"{self.path}: rewritten with the columns of this version "
                  f"({', '.join(f'{c}={_spelled(v)}' for c, v in ADDED.items() if c not in header)} in its rows)")

    def is_done(self, row: dict) -> bool:
        return row_key(row) in self.done

    def write(self, rows: list[dict]) -> None:
        new = []
        for row in rows:
            key = row_key(row)
            if key in self.done:
                continue
            unknown = set(row) - set(COLUMNS)
            if unknown:
                raise ValueError(f"unknown columns {sorted(unknown)}")
            new.append({c: _cell(row.get(c)) for c in COLUMNS})
            self.done.add(key)
        if not new:
            return
        self.open()
        if self._f is None:
            self._start_fresh()
        self._io(lambda: (self._w.writerows(new), self._sync()))
        if self._temp is not None and not self._temp.placed:
            self._temp.place()  # from here on the open file is the CSV itself

    def _start_fresh(self) -> None:
        from .safefile import Temp

        self._temp = Temp(self.path, what="results CSV")
        self._f = self._temp.f
        self._w = csv.DictWriter(self._f, fieldnames=COLUMNS)
        self._w.writeheader()

    def _sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._temp is not None:
            self._temp.discard()
        elif self._f is not None:
            self._f.close()
            if self.retry_failed:
                self._rewrite()
        self._f = self._temp = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()


def _spelled(d) -> str:
    return f"its {d}" if isinstance(d, Same) else (str(d) or "empty")


def _upgradable(header: list[str]) -> bool:
    """This version's columns in order, less some of ADDED."""
    return [c for c in COLUMNS if c in header] == header and set(COLUMNS) - set(header) <= set(ADDED)


def _header_only(path: Path) -> bool:
    """A file holding this version's header and nothing else (left by a run that wrote no row)."""
    head = ",".join(COLUMNS)
    if path.stat().st_size > len(head) + 2:
        return False
    try:
        return path.read_bytes().decode("utf-8").rstrip("\r\n") == head
    except (OSError, UnicodeDecodeError):
        return False


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if v == v else "nan"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return v


NUMERIC = ("median_ms", "p20_ms", "p80_ms", "tflops", "roofline", "rel_err", "tolerance", "floor_ms", "peak_mem_mb")
INTEGER = ("B", "H", "T", "D", "H_kv", "Tq")


def merge_results(paths: list, out, replace: bool = False) -> tuple[int, int]:
    """Join results CSVs of one GPU into ``out`` (written whole, this version's columns), rows in
    the order of the files. A row whose (configuration, implementation) an earlier row holds
    replaces it where that row failed in the same file (as ``--retry-failed`` leaves them) or
    with ``replace``; otherwise BadInput names both. BadInput too for a file that is missing,
    not a results CSV, holds a record cut short, or rows of another GPU than the first file's.
    Returns (rows written, rows replaced)."""
    from .safefile import probe, write_atomically

    probe(out, "--out")
    rows: dict = {}  # key -> (row, path, line)
    gpu = None
    replaced = 0
    for path in map(Path, paths):
        if not path.is_file():
            raise BadInput(f"results CSV {path} does not exist" if not path.exists() else
                           f"results CSV {path} is not a regular file")
        header, records = scan(path)
        if header != COLUMNS and not _upgradable(header):
            raise BadInput(f"{path} is not a results CSV of this version (its columns differ)")
        for rec in records:
            if rec.problem == "blank":
                continue
            if rec.problem:
                raise BadInput(f"{path} line {rec.line}: {rec.problem}; `attnbench sweep --resume --out {path}` "
                               "sets such records aside")
            row = with_added(rec.row)
            gpu = gpu or (row["gpu"], path)
            if row["gpu"] != gpu[0]:
                raise BadInput(f"{path} line {rec.line} is a row of {row['gpu']!r}, {gpu[1]} of {gpu[0]!r}: "
                               "merge the rows of one GPU")
            held = rows.get(rec.key)
            if held is not None:
                own = held[1] == path and held[0]["status"] == "failed"
                if not (own or replace):
                    raise BadInput(f"{path} line {rec.line} and {held[1]} line {held[2]} hold the same "
                                   f"(configuration, implementation): {row['impl']} {row['label']} T={row['T']} "
                                   f"D={row['D']} pass={row['pass']} (--replace keeps the later)")
                replaced += not own
            rows[rec.key] = (row, path, rec.line)

    def write(f):
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(r for r, _, _ in rows.values())
    write_atomically(out, write, what="--out")
    return len(rows), replaced


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
        df = pd.read_csv(p, keep_default_na=False, na_values=[""],
                         dtype={"reason": str, "git_commit": str, "cache_lens": str})
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
    for col, d in ADDED.items():  # a file of an older version: the value its rows take (a number not measured: NaN)
        fill = df[d] if isinstance(d, Same) else (float("nan") if col in NUMERIC else d)
        df[col] = df[col].fillna(fill) if col in df.columns else fill
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
        return pattern_label(pattern, params_from_json(pattern, params)) if pattern in PATTERNS else fallback
    except (TypeError, ValueError, BadInput):
        return fallback
