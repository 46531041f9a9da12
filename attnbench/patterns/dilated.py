"""dilated: d = i - j (or |i - j|), d < W*r and d % r == 0; with ``levels``, the union of several
(W, r) levels, LongNet-style. Device predicate: kernels/patterns/dilated.cuh. One level with r > 1
is strided: each residue class mod r is a window of W."""
from itertools import combinations
from math import lcm

import numpy as np

from .base import BadInput, Param, Pattern, window_lo_hi
from .class_bands import MAX_CLASSES, bands_of

MAX_LEVELS = 8  # extra levels the device struct holds (kernels/patterns/dilated.cuh)


class Dilated(Pattern):
    name = "dilated"
    params = (Param("window", 64, 1, "keys per side"),
              Param("dilation", 2, 1, "stride r between keys"),
              Param("levels", (), 1, f"more (window, dilation) levels, joined to the first (at most {MAX_LEVELS})",
                    kind="pairs", column=False))
    summary = "dilated window: d = i - j (or |i - j|), d < W*r and d % r == 0; levels: the union of several"
    short, short_key = "{window}/{dilation}", "window/dilation"

    @staticmethod
    def all_levels(p) -> list[tuple[int, int]]:
        return list(dict.fromkeys(((p["window"], p["dilation"]),) + tuple(p["levels"])))

    def validate(self, T, p):
        if len(p["levels"]) > MAX_LEVELS:
            raise BadInput(f"levels holds {len(p['levels'])} levels, above the {MAX_LEVELS} the kernels take")

    def label_items(self, p):
        items = super().label_items(p)
        if p.get("levels"):
            return [(k, "+".join(f"{w}:{r}" for w, r in self.all_levels(p)) if k == "levels" else v)
                    for k, v in items if k == "levels"]
        return [(k, v) for k, v in items if k != "levels"]

    def short_label(self, p):
        return super().short_label(p) if not p.get("levels") else "+".join(f"{w}/{r}" for w, r in self.all_levels(p))

    def allowed(self, i, j, T, causal, p, table):
        d = abs(i - j)
        out = None
        for W, r in self.all_levels(p):
            lvl = (d < W * r) & (d % r == 0)
            out = lvl if out is None else out | lvl
        return out

    def row_counts(self, i, T, causal, p, table):
        """Allowed distances d behind (d <= i) and, not causal, ahead (d <= T - 1 - i): a union of
        arithmetic progressions, counted by inclusion-exclusion over the levels."""
        lv = self.all_levels(p)
        back = np.zeros_like(i)
        ahead = np.zeros_like(i)
        for n in range(1, len(lv) + 1):
            sign = 1 if n % 2 else -1
            for sub in combinations(lv, n):
                m = lcm(*(r for _, r in sub))
                reach = min((W - 1) * r for W, r in sub)  # the largest d every level of sub allows
                back += sign * (np.minimum(reach, i) // m + 1)
                if not causal:
                    ahead += sign * (np.minimum(reach, T - 1 - i) // m)
        return back + ahead

    def intervals(self, i, T, causal, p, table, split):
        fams = [window_lo_hi(i, T, (W - 1) * r + 1, causal) for W, r in self.all_levels(p)]
        exact = [r == 1 for _, r in self.all_levels(p)]
        return np.stack([lo for lo, _ in fams]), np.stack([hi for _, hi in fams]), exact

    def device_args(self, p):
        extra = self.all_levels(p)[1:]
        return (p["window"], p["dilation"]) + ((len(extra),) + tuple(x for lv in extra for x in lv) if extra else ())

    def strided(self, p):
        # i - j = r * (a - b) on one residue class: |a - b| < W, i.e. a window of W
        if p["dilation"] > 1 and len(self.all_levels(p)) == 1:
            return (p["dilation"], "window", {"window": p["window"]})
        return None

    def class_major(self, p, causal):
        # several levels whose dilations all divide r: i - j = r * (a - b) + (cq - ck) is a multiple of
        # a level's dilation s for every pair of a class pair or for none, and the distances a level
        # allows are a ball around 0, so each class pair is one band
        lv = self.all_levels(p)
        r = lcm(*(s for _, s in lv))
        if len(lv) < 2 or r < 2 or r > MAX_CLASSES:
            return None

        def allowed_d(dist):
            out = np.zeros(dist.shape, bool)
            for W, s in lv:
                out |= (np.abs(dist) < W * s) & (dist % s == 0)
            return out

        return r, bands_of(allowed_d, r, causal, max((W - 1) * s for W, s in lv))

    def examples(self, T):
        return [{}, {"window": 7, "dilation": 3}, {"window": 40, "dilation": 1},
                {"window": 8, "dilation": 1, "levels": ((6, 2), (4, 4))}]
