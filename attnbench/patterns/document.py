"""document: packed documents, each token attending only inside its own document (causally when the
mask is causal), optionally within a window there. Device predicate: kernels/patterns/document.cuh,
reading each position's document bounds from the table."""
from __future__ import annotations

import numpy as np

from .base import BadInput, Param, Pattern

MAX_DRAWS = 1 << 24  # documents drawn from the length distribution, at most


class Document(Pattern):
    name = "document"
    params = (Param("doc_lens", (), 1, "document lengths, summing to T (empty: drawn log-normal around "
                                       "--doc-mean)", kind="ints", column=False),
              Param("doc_mean", 2048, 1, "mean document length of the log-normal draw"),
              Param("doc_seed", 0, 0, "seed of the draw", column=False),
              Param("window", 0, 0, "keys per side within distance < W inside a document (0: the whole document)"))
    summary = "packed documents: i and j in one document (and |i - j| < W when W > 0)"
    uses_table = True
    builds_on_device = True

    def lengths(self, T: int, p: dict) -> np.ndarray:
        """The document lengths: the given list, or log-normal draws (sigma 1, the given mean) cut at T."""
        if p["doc_lens"]:
            return np.asarray(p["doc_lens"], np.int64)
        rng = np.random.default_rng(p["doc_seed"])
        mu = np.log(p["doc_mean"]) - 0.5  # the mean of a log-normal with sigma 1 is exp(mu + 1/2)
        out, total = [], 0
        while total < T:
            n = min(max(64, 2 * (T - total) // p["doc_mean"] + 1), MAX_DRAWS)
            d = np.maximum(np.rint(rng.lognormal(mu, 1.0, n)), 1).astype(np.int64)
            out.append(d)
            total += int(d.sum())
        lens = np.concatenate(out)
        ends = np.cumsum(lens)
        k = int(np.searchsorted(ends, T))  # the document that reaches T, cut there
        lens = lens[:k + 1].copy()
        lens[k] -= int(ends[k] - T)
        return lens

    def validate(self, T, p):
        if p["doc_lens"] and sum(p["doc_lens"]) != T:
            raise BadInput(f"doc_lens sum to {sum(p['doc_lens'])}, not T={T}")

    def label_items(self, p):
        items = super().label_items(p)
        if p.get("doc_lens"):  # a long list: its count stands for it
            items = [("docs", len(p["doc_lens"])) if k == "doc_lens" else (k, v) for k, v in items
                     if k != "doc_mean"]
        else:
            items = [(k, v) for k, v in items if k != "doc_lens"]
        return [(k, v) for k, v in items if not (k == "window" and v == 0)]

    def make_table(self, T, p):
        """[T, 2] int32: the start and end (exclusive) of each position's document."""
        lens = self.lengths(T, p)
        ends = np.cumsum(lens)
        starts = ends - lens
        doc = np.repeat(np.arange(lens.size), lens)
        return np.stack([starts[doc], ends[doc]], axis=1).astype(np.int32)

    def torch_table(self, T, p, table, device):
        import torch

        return torch.as_tensor(table.astype(np.int64), device=device)

    def device_args(self, p):
        return (p["window"],)  # the lengths made the table

    def allowed(self, i, j, T, causal, p, table):
        inside = (j >= table[i, 0]) & (j < table[i, 1])
        W = p["window"]
        if W:
            d = i - j
            inside = inside & (d < W) & (d > -W)
        return inside

    def _lo_hi(self, i, T, causal, p, table):
        lo, hi = table[i, 0].astype(np.int64), table[i, 1].astype(np.int64)
        if causal:
            hi = np.minimum(hi, i + 1)
        W = p["window"]
        if W:
            lo = np.maximum(lo, i - W + 1)
            hi = np.minimum(hi, i + W)
        return lo, hi

    def row_counts(self, i, T, causal, p, table):
        lo, hi = self._lo_hi(i, T, causal, p, table)
        return hi - lo

    def intervals(self, i, T, causal, p, table, split):
        lo, hi = self._lo_hi(i, T, causal, p, table)
        return lo[None], hi[None], [True]

    def tile_bounds(self, mask, BM, BN):
        """The list in closed form: lo and hi never decrease along the rows, so a query tile's hull
        is [lo(first row), hi(last row)) and what all its rows allow [lo(last), hi(first)), read
        from the table at each tile's first and last rows (strided views, no gather)."""
        T, W, table = mask.T, mask.params["window"], mask.table
        nq = -(-T // BM)
        b = np.empty((nq, 4), np.int64)
        lo0, lo1, hi0, hi1 = b.T  # lo and hi of each tile's first and last rows, then its bounds
        first, last = table[::BM], table[BM - 1::BM]  # the document (start, end) of those rows
        if last.shape[0] < nq:  # a last tile cut short by T
            last = np.concatenate([last, table[-1:]])
        lo0[:] = first[:, 0]
        lo1[:] = last[:, 0]
        r0 = np.arange(0, T, BM, dtype=np.int64)
        if W:
            r1 = r0 + (BM - 1)
            r1[-1] = T - 1
            np.maximum(lo0, r0 - (W - 1), out=lo0)
            np.maximum(lo1, r1 - (W - 1), out=lo1)
        if mask.causal:  # the row itself ends its keys (it is inside its document, and W >= 1)
            np.add(r0, 1, out=hi0)
            np.add(r0, BM, out=hi1)
            hi1[-1] = T
        else:
            hi0[:] = first[:, 1]
            hi1[:] = last[:, 1]
            if W:
                np.minimum(hi0, r0 + W, out=hi0)
                np.minimum(hi1, r1 + W, out=hi1)
        # the key tiles: ks = lo0 // BN, fs = ceil(lo1 / BN), fe = hi0 // BN, ke = ceil(hi1 / BN)
        flat = b.ravel()
        flat[1::2] += BN - 1
        if BN & (BN - 1):
            flat //= BN
        else:  # a shift: half a division's cost
            flat >>= BN.bit_length() - 1
        np.maximum(hi0, lo1, out=hi0)  # no full tiles: fe = fs
        return b

    def device_tiles(self, mask, BM, BN, parts=None):
        """One launch from the document boundaries (attnbench/document_tiles.py)."""
        from ..document_tiles import build

        return build(mask, BM, BN, parts)

    def examples(self, T):
        ones = min(T, 2)  # documents of length 1 too
        rest = T - ones
        lens = (1,) * ones + tuple(x for x in (rest // 3, rest - rest // 3) if x > 0)
        return [{"doc_lens": lens}, {"doc_mean": max(1, T // 5), "doc_seed": 1},
                {"doc_mean": max(1, T // 2), "window": 5}]
