"""What a pattern is: its declared parameters and the functions every pattern file defines.

A pattern is one unit: ``attnbench/patterns/<name>.py`` (a ``Pattern`` subclass) beside
``kernels/patterns/<name>.cuh`` (its device predicate, the struct ``ab_<name>``). The Python side
gives:
  * ``params``: typed parameters (defaults, minimum, help; the CLI options, sweep axes and CSV
    columns are generated from them) and ``validate`` for limits that depend on T;
  * ``allowed(i, j)``: the vectorised predicate (the reference mask); the same code runs on numpy
    arrays and on torch tensors (``Mask.mask_mod`` hands it to FlexAttention);
  * ``row_counts(i)``: the exact number of allowed keys of each row, in closed form;
  * ``intervals(i)``: for each row, a few key intervals ("families") that cover every allowed key;
    a family marked exact allows every key inside it (``attnbench.tiles`` builds tile lists from them);
  * ``device_args``: the integers the device struct's fields take after ``causal``, in order;
  * ``examples(T)``: parameter sets valid at T, over which the tests and ``check`` run;
  * optionally ``tile_bounds``: a one-family pattern's tile list bounds in closed form (document).
The causal clause (``j <= i``) is applied on top of every pattern by ``Mask``. A pattern without
closed-form counts and intervals (``custom``) overrides ``build_tiles`` (its lists by
classification), ``extra_defines`` (-D constants beyond the struct's fields) and ``check_mask``
(checks that need the whole mask, such as a row with no key).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import BadInput


@dataclass(frozen=True)
class Param:
    name: str
    default: int | tuple
    minimum: int         # of the value, or of every element of a list
    help: str
    option: str = ""     # the command-line option (default: the name with dashes)
    column: bool = True  # a CSV column of its own (every parameter is in the params JSON column)
    kind: str = "int"    # "int"; "ints": a list, written 1000,3000; "pairs": a list of pairs, 2048:1,4096:2;
    #                      "str": text; "named": named integers, W=1024,S=4 (a repeatable option)

    @property
    def flag(self) -> str:
        return "--" + (self.option or self.name.replace("_", "-"))

    def value(self, v):
        """``v`` checked and normalised (an int, a tuple of ints, a tuple of int pairs, a string, or
        a tuple of (name, int) pairs sorted by name); BadInput naming the parameter."""
        if self.kind == "str":
            if not isinstance(v, str):
                raise BadInput(f"{self.name}={v!r} must be a string")
            return v
        if self.kind == "named":
            return self._named(v)
        if self.kind == "pairs":
            if isinstance(v, str):
                try:
                    v = tuple(tuple(int(x) for x in item.split(":")) for item in v.replace(" ", "").split(",") if item)
                except ValueError:
                    raise BadInput(f"{self.name}={v!r} must be pairs a:b separated by commas") from None
            if not isinstance(v, (list, tuple)) or not all(
                    isinstance(x, (list, tuple)) and len(x) == 2 and all(_is_int(y) for y in x) for x in v):
                raise BadInput(f"{self.name}={v!r} must be a list of integer pairs (a:b,c:d on the command line)")
            low = [y for x in v for y in x if y < self.minimum]
            if low:
                raise BadInput(f"{self.name} holds {low[0]}, below its minimum {self.minimum}")
            return tuple((int(a), int(b)) for a, b in v)
        if self.kind == "ints":
            if isinstance(v, str):
                try:
                    v = tuple(int(x) for x in v.replace(" ", "").split(",") if x)
                except ValueError:
                    raise BadInput(f"{self.name}={v!r} must be integers separated by commas") from None
            if not isinstance(v, (list, tuple)) or not all(_is_int(x) for x in v):
                raise BadInput(f"{self.name}={v!r} must be a list of integers")
            low = [x for x in v if x < self.minimum]
            if low:
                raise BadInput(f"{self.name} holds {low[0]}, below its minimum {self.minimum}")
            return tuple(int(x) for x in v)
        if isinstance(v, str):
            try:
                v = int(v)
            except ValueError:
                raise BadInput(f"{self.name}={v!r} must be an integer") from None
        if not _is_int(v):
            raise BadInput(f"{self.name}={v!r} must be an integer")
        if v < self.minimum:
            raise BadInput(f"{self.name}={v} is below its minimum {self.minimum}")
        return int(v)

    def _named(self, v) -> tuple[tuple[str, int], ...]:
        """NAME=VALUE items: a string (``W=1024,S=4``), a sequence of such strings or of (name, value)
        pairs, or a dict."""
        items = list(v.items()) if isinstance(v, dict) else [v] if isinstance(v, str) else v
        if not isinstance(items, (list, tuple)):
            raise BadInput(f"{self.name}={v!r} must be NAME=VALUE items")
        out: dict[str, int] = {}
        for item in items:
            if isinstance(item, str):
                pairs = [part.partition("=")[::2] if "=" in part else (part, None)
                         for part in (x.strip() for x in item.split(",")) if part]
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                pairs = [tuple(item)]
            else:
                raise BadInput(f"{self.name}={item!r} must be NAME=VALUE")
            for name, value in pairs:
                name = str(name).strip()
                if value is None or not NAME.match(name):
                    raise BadInput(f"{self.name} {name!r} must be NAME=VALUE, NAME a name (letters, digits, _)")
                if name in out:
                    raise BadInput(f"{self.name} {name} is given twice")
                try:
                    out[name] = int(value.strip()) if isinstance(value, str) else value
                except ValueError:
                    raise BadInput(f"{self.name} {name}={value.strip()!r} must be an integer") from None
                if not _is_int(out[name]):
                    raise BadInput(f"{self.name} {name}={value!r} must be an integer")
                if out[name] < self.minimum:
                    raise BadInput(f"{self.name} {name}={out[name]} is below its minimum {self.minimum}")
        return tuple(sorted((k, int(x)) for k, x in out.items()))


NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a parameter name of named integers


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


_HOST = (np.ndarray, np.generic, int, float)


def is_torch(x) -> bool:
    """True for a torch tensor, i.e. anything but a numpy array or a number. torch is never
    imported here, and a plain isinstance test also holds inside a torch.compile trace."""
    return not isinstance(x, _HOST)


def window_lo_hi(i, T, W, causal):
    """Keys of row i within distance < W: [lo, hi), clipped to the sequence."""
    lo = i - W + 1
    hi = i + 1 if causal else i + W
    return np.maximum(lo, 0), np.minimum(hi, T)


def tiles_divide(block, BM, BN) -> bool:
    """Every aligned BM x BN tile lies inside one block x block square."""
    return block % BM == 0 and block % BN == 0


def divisors_of(T: int, wanted) -> list[int]:
    """Those of the wanted block sizes that divide T, else T itself (examples of block patterns)."""
    return [b for b in wanted if T % b == 0] or [T]


class Pattern:
    name: str = ""
    params: tuple[Param, ...] = ()
    summary: str = ""
    short: str = ""         # its values in tables and legends, e.g. "{sink}+{window}" (default: comma-joined)
    short_key: str = ""     # what ``short`` spells, e.g. "sink+window"
    default_causal: bool = True  # what a sweep takes when the causal flag is not forced
    uses_table: bool = False     # the device struct's last field is the table (make_table)
    builds_on_device: bool = False  # device_tiles builds the forward list (and table) on the device
    user_predicate: bool = False    # its device predicate is the user's own code, of any cost in registers

    # -- per-pattern definition -------------------------------------------------
    def validate(self, T: int, p: dict) -> None:
        """Extra checks beyond each parameter's minimum (sizes that do not fit T)."""

    def allowed(self, i, j, T: int, causal: bool, p: dict, table):
        raise NotImplementedError

    def predicate(self, T: int, causal: bool, p: dict, table):
        """``allowed`` with T, the parameters and the table bound: a function (i, j) of index
        tensors. FlexAttention traces it under torch.compile, so a pattern whose ``allowed`` looks
        something up in a cache (custom's bound expression) resolves that here, outside the trace:
        a cache lookup inside breaks the graph, and the block mask's build then runs eagerly over
        all T x T pairs."""
        return lambda i, j: self.allowed(i, j, T, causal, p, table)

    def row_counts(self, i, T: int, causal: bool, p: dict, table):
        raise NotImplementedError

    def intervals(self, i, T: int, causal: bool, p: dict, table, split: int):
        """Return (lo, hi, exact): lo/hi int64 arrays [F, len(i)] of half-open key
        intervals (hi <= lo means empty), exact a bool per family. Causal clipping is
        applied by the caller. ``split`` > 1 asks patterns whose families are constant
        over blocks of rows to split them so rows of one query tile do not mix."""
        raise NotImplementedError

    def check_params(self, p: dict) -> None:
        """Checks that depend on no T (a sweep refuses values failing them before any case)."""

    def check_mask(self, mask) -> None:
        """Checks of the validated mask as a whole (custom: every row allows a key)."""

    def build_tiles(self, mask, BM: int, BN: int, fresh: bool = False):
        """The tile list by other means than ``intervals`` (custom: by classification), or None for
        the interval build; ``fresh``: not from a cache of the pattern's own."""
        return None

    def tile_bounds(self, mask, BM: int, BN: int):
        """The interval build's list of a one-family pattern in closed form, or None for the
        interval build: int64 [n_qtiles, 4], per query tile ks <= fs <= fe <= ke, its key tiles
        [ks, fs) partial, [fs, fe) full and [fe, ke) partial (``attnbench.tiles`` cuts the runs)."""
        return None

    def device_tiles(self, mask, BM: int, BN: int, parts: dict | None = None):
        """Where ``builds_on_device``: the list ``tile_bounds`` gives, and the table, built on the
        current device from the parameters alone (``attnbench.tiles.DeviceTiles``, its ``table``
        set), which the forward kernels then read; ``parts``: a dict to receive the seconds of
        each piece of the build (``attnbench tiles`` reports them)."""
        raise NotImplementedError

    def extra_defines(self, T: int, p: dict) -> dict:
        """-D constants the device struct needs beyond its fields (custom: its expression)."""
        return {}

    def examples(self, T: int) -> list[dict]:
        """Parameter sets valid at T (the defaults first when they are), for tests and the gate."""
        return [{}]

    def device_args(self, p: dict) -> tuple[int, ...]:
        """The device struct's fields after ``causal``: every parameter, in declared order."""
        return tuple(int(p[q.name]) for q in self.params)

    def monotone_run(self, p: dict) -> int | None:
        """Rows in runs of this length (None: all rows) over which lo and hi of every family
        never decrease: the tile builder then needs only each run's first and last row."""
        return None

    def uniform_tiles(self, p: dict, BM: int, BN: int) -> bool:
        """True when allowed(i, j) before the causal clause is one value over each aligned tile of
        BM rows and BN keys: a partial tile of such a list is partial only through the causal
        clause (or the end of the sequence), and a kernel needs dense's predicate there."""
        return False

    def make_table(self, T: int, p: dict):
        return None

    def strided(self, p: dict) -> tuple[int, str, dict] | None:
        """(r, inner pattern, its parameters) when allowed(i, j) holds only for i = j (mod r) and,
        on each residue class taken as a sequence of its own, equals the inner pattern; kernels
        then gather rows at stride r and work on dense tiles of the inner pattern."""
        return None

    def class_major(self, p: dict, causal: bool) -> tuple[int, tuple] | None:
        """(r, bands) when, with positions taken class by class mod r (``class_bands``: position
        c * (T / r) + a is a * r + c), the live pairs of each class pair (cq, ck) are one band
        lo <= a - b <= hi: the (lo, hi) per class pair, query class major, the causal clause in them.
        Kernels can then run the pattern on permuted copies of the inputs (``attnbench.classes``)
        with every band's tiles full but at its edges."""
        return None

    def in_place(self, p: dict) -> dict | None:
        """The parameters of this layout pattern read in place by the kernels (its rows where they lie in the
        arrays, kernels/tc/rows.cuh), where its rows allow it; None: not a layout, or one that must be copied."""
        return None

    def rows_in_place(self, p: dict) -> int:
        """LAYOUT_R of the kernels: the classes of a layout read in place (``in_place``'s parameters), else 1."""
        return 1

    def torch_table(self, T: int, p: dict, table, device):
        """What ``allowed`` reads in place of ``table`` when the indices are torch tensors."""
        return None

    # -- shared ------------------------------------------------------------------
    def label_items(self, p: dict) -> list[tuple[str, object]]:
        """(name, value) of the parameters a label shows: those given, in declared order, seeds
        left out (they make a table, not a shape)."""
        return [(q.name, p[q.name]) for q in self.params if not q.name.endswith("seed") and q.name in p]

    def short_label(self, p: dict) -> str:
        """The values alone (``16+64``), for tables and legends; empty for a pattern with none."""
        if self.short:
            try:
                return self.short.format(**p)
            except KeyError:  # a parameter it spells is missing: the plain form
                pass
        return ",".join(str(v) for _, v in self.label_items(p))

    def defaults(self) -> dict:
        return {q.name: q.default for q in self.params}

    @property
    def device_struct(self) -> str:
        """The device predicate's struct, defined in kernels/patterns/<name>.cuh."""
        return f"ab_{self.name}"


__all__ = ["BadInput", "Param", "Pattern", "is_torch", "window_lo_hi", "tiles_divide", "divisors_of"]
