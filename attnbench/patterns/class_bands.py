"""class_bands: a pattern of the class-major layout (``attnbench.classes``), not one to sweep.

Positions are taken in residue classes mod r: position ``c * n + a`` (n = T / r) stands for the
original position ``a * r + c``. A pattern whose live pairs, in those coordinates, are a band
``lo <= a - b <= hi`` for each pair of classes (cq, ck) of query and key (``Mask.class_major``:
dilated with several levels) is this pattern with those bands; its causal clause, if any, is in the
bands, so the mask itself is not causal. Every band is exact, so its tile lists come from the
intervals, and a tile is partial only where a band's edge crosses it. With ``in_place`` 1 the kernels
read and write the arrays in the sequence's order, each layout row where it lies (kernels/tc/rows.cuh).
Device predicate: kernels/patterns/class_bands.cuh."""
import numpy as np

from .base import BadInput, Param, Pattern

MAX_CLASSES = 8  # the device struct holds the bands of up to MAX_CLASSES x MAX_CLASSES class pairs
EMPTY = (1, 0)   # a band no pair lies in (lo > hi)
IN_PLACE_ROWS = 128  # in_place 1: the classes' lengths a multiple of the tallest tile (kernels/tc/rows.cuh)


class ClassBands(Pattern):
    name = "class_bands"
    params = (Param("classes", 1, 1, "residue classes r"),
              Param("length", 1, 1, "positions per class, n = T / r"),
              Param("bands", (), -(1 << 30), "(lo, hi) of a - b per class pair, query class major", kind="pairs",
                    column=False),
              Param("in_place", 0, 0, "1: the kernels read and write the layout in the sequence's order (no copies)",
                    column=False))
    summary = "class-major bands: position c * (T / r) + a is a * r + c; lo <= a - b <= hi per class pair"

    def validate(self, T, p):
        r = p["classes"]
        if r > MAX_CLASSES:
            raise BadInput(f"classes={r} exceeds the {MAX_CLASSES} the device predicate holds")
        if r * p["length"] != T:
            raise BadInput(f"classes={r} x length={p['length']} is not T={T}")
        if len(p["bands"]) != r * r:
            raise BadInput(f"bands holds {len(p['bands'])} pairs; classes={r} needs {r * r}")
        if p.get("in_place", 0) not in (0, 1):
            raise BadInput(f"in_place={p['in_place']} must be 0 or 1")
        if p.get("in_place") and p["length"] % IN_PLACE_ROWS:
            raise BadInput(f"in_place=1 needs length={p['length']} (positions per class) to be a multiple of "
                           f"{IN_PLACE_ROWS}: a tile of the kernels must lie in one class")

    @staticmethod
    def _split(x, T, r):
        n = T // r
        return x // n, x % n

    def _lo_hi(self, p):
        b = np.asarray(p["bands"], np.int64).reshape(-1, 2)
        return b[:, 0], b[:, 1]

    def allowed(self, i, j, T, causal, p, table):
        r = p["classes"]
        lo, hi = self._lo_hi(p)
        cq, a = self._split(np.asarray(i), T, r)
        ck, b = self._split(np.asarray(j), T, r)
        d = a - b
        k = cq * r + ck
        return (d >= lo[k]) & (d <= hi[k])

    def _family(self, i, T, p, ck):
        """Keys of class ck that row i allows: [lo, hi) in the permuted positions (empty: hi <= lo)."""
        r = p["classes"]
        n = T // r
        blo, bhi = self._lo_hi(p)
        cq, a = self._split(i, T, r)
        k = cq * r + ck
        first = np.clip(a - bhi[k], 0, n)          # b >= a - hi
        end = np.clip(a - blo[k] + 1, 0, n)        # b <= a - lo
        empty = blo[k] > bhi[k]                    # no row of the pair: one empty interval for all
        lo = ck * n + np.where(empty, 0, first)
        return lo, np.maximum(ck * n + np.where(empty, 0, end), lo)

    def monotone_run(self, p):
        """Within a class (n rows) lo and hi never decrease; they jump back where the class changes."""
        return p["length"]

    def row_counts(self, i, T, causal, p, table):
        out = np.zeros_like(i)
        for ck in range(p["classes"]):
            lo, hi = self._family(i, T, p, ck)
            out += hi - lo
        return out

    def intervals(self, i, T, causal, p, table, split):
        """One family per key class, or with ``split`` > 1 one per key class and query class mod
        split (rows of other query classes hold it empty), so the classes sharing a query tile
        keep their hulls apart."""
        r = p["classes"]
        fams = [self._family(i, T, p, ck) for ck in range(r)]
        if split > 1:
            s = (np.asarray(i) // (T // r)) % split
            fams = [(np.where(s == m, lo, 0), np.where(s == m, hi, 0)) for lo, hi in fams for m in range(split)]
        return (np.stack([lo for lo, _ in fams]), np.stack([hi for _, hi in fams]), [True] * len(fams))

    def extra_defines(self, T, p):
        """The bands as a constant-memory table (kernels/patterns/class_bands.cuh), read by index."""
        d = {"AB_CLASS_BANDS_TABLE": ",".join(str(int(x)) for band in p["bands"] for x in band)}
        if p.get("in_place"):  # the kernels' rows where they lie in the arrays (kernels/tc/rows.cuh)
            d.update(LAYOUT_R=int(p["classes"]), LAYOUT_N=int(p["length"]))
        return d

    def in_place(self, p):
        # a tile of the kernels (up to 128 rows) must lie in one class
        return None if p["length"] % IN_PLACE_ROWS else dict(p, in_place=1)

    def rows_in_place(self, p):
        return int(p["classes"]) if p.get("in_place") else 1

    def device_args(self, p):
        return (p["classes"], p["length"]) + tuple(x for band in p["bands"] for x in band)

    def examples(self, T):
        return [{"classes": 1, "length": T, "bands": ((-T, T),)}]


def bands_of(allowed_d, r: int, causal: bool, reach: int) -> tuple:
    """The bands of a pattern that allows i - j = r * (a - b) + (cq - ck) by distance alone:
    ``allowed_d(dist)`` (a boolean array over dist) for |dist| <= reach, nothing farther; causal: dist >= 0.
    Each class pair's allowed a - b must be one interval (else BadInput): the band, or EMPTY."""
    out = []
    for cq in range(r):
        for ck in range(r):
            delta = cq - ck
            d = np.arange(-(reach // r) - 2, reach // r + 3)
            dist = r * d + delta
            ok = (np.abs(dist) <= reach) & allowed_d(dist)
            if causal:
                ok &= dist >= 0
            live = d[ok]
            if not live.size:
                out.append(EMPTY)
                continue
            if live.size != live[-1] - live[0] + 1:
                raise BadInput(f"class pair ({cq}, {ck}) of classes={r} is no band: its a - b are not one interval")
            out.append((int(live[0]), int(live[-1])))
    return tuple(out)
