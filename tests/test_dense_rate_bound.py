"""scripts/dense_rate_bound.py on the committed H200 training rows (a host count, no GPU)."""
import pandas as pd
import pytest
from scriptmod import ROOT, script


def _script():
    return script("dense_rate_bound")


def _rows(*names):
    return pd.concat([pd.read_csv(ROOT / "results" / n, dtype={"git_commit": str}) for n in names], ignore_index=True)


@pytest.fixture(scope="module")
def bound():
    return _script().table(_rows("train-32768-h200.csv"))


def test_dense_is_its_own_rate(bound):
    dense = bound[bound.instance == "dense"]
    assert len(dense) == 2
    assert (dense.eff_fwd == 1).all() and (dense.eff_bwd == 1).all()


def test_the_lists_visit_what_their_tiles_cover(bound):
    """A window of 256 in 64 x 64 tiles: a query tile reads 4 full-width tiles and one more at the diagonal
    and the far edge, 5 x 64 of 4 x 64 keys: 1.25; block-diagonal 16 in 64 x 64 tiles: 4."""
    w = bound[bound.instance == "window(window=256)"].set_index("D")
    assert w.visited_bwd.round(2).tolist() == [1.25, 1.25]
    bd = bound[bound.instance == "block_diagonal(block=16)"].set_index("D")
    assert bd.visited_bwd.round(2).tolist() == [4.0, 4.0]
    # the bound scales dense's time by the visited pairs
    dn = bound[bound.instance == "dense"].set_index("D")
    assert w.bwd_at_dense[64] < dn.bwd[64] * 0.03


def test_the_class_layout_against_fast_tc_dense_rate():
    """fast-tc-classes' rows ran 64 x 64 lists at both D (their setup_s says so), so its lists visit 1.06x the
    live pairs at both, though fast-tc now takes 128 x 128 tiles for them at D=128."""
    t = _script().table(_rows("train-32768-h200.csv", "classes-32768-h200.csv"), impl="fast-tc-classes")
    assert set(t.instance) == {"dilated(levels=2048:1+2048:2+2048:4)"}
    assert t.visited_fwd.round(2).tolist() == [1.06, 1.06]


def test_the_lists_are_counted_in_the_shape_the_rows_ran():
    """A row's tile_config (setup_s) sets the forward list's tiles; without one, the shape fast-tc chooses now."""
    s = _script()
    rows = _rows("train-32768-h200.csv")
    dense = rows[(rows.impl == "fast-tc") & (rows.pattern == "dense") & (rows.D == 128)]
    assert s.ran_tile(dense) == (128, 128)  # the long shape, two warpgroups of 64 rows
    assert s.ran_tile(dense.assign(setup_s=None)) is None


def test_one_T_at_a_time():
    rows = _rows("train-32768-h200.csv")
    other = rows.assign(T=4096)
    with pytest.raises(SystemExit, match="one T expected"):
        _script().table(pd.concat([rows, other]))


def test_the_forward_bar_from_forward_rows_alone():
    """The llm CSV (forward rows, several T): --T takes one; the forward bar is cuDNN on dense, 2x Flex or 80%
    of the floor on the rest; the backward's columns stay empty."""
    rows = _rows("llm-h200.csv")
    t = _script().table(rows, T=32768)
    dense = t[t.instance == "dense"].set_index("D")
    ok = rows[(rows.status == "ok") & (rows["T"] == 32768) & (rows.pattern == "dense") & (rows["pass"] == "fwd")]
    cudnn = ok[ok.impl == "sdpa-cudnn"].set_index("D").median_ms
    assert dense.fwd_target.to_dict() == pytest.approx(cudnn.to_dict())
    w = t[(t.instance == "window(window=256)") & (t.D == 64)].iloc[0]
    wr = rows[(rows.status == "ok") & (rows["T"] == 32768) & (rows.label == "window(window=256)") & (rows.D == 64)]
    flex, floor = wr[wr.impl == "flex"].median_ms.min(), wr[wr.impl == "fast-tc"].floor_ms.min()
    assert w.fwd_target == pytest.approx(flex / 2 if flex / 2 >= floor else floor / 0.8)
    assert pd.isna(w.bwd) and pd.isna(w.target)
    sparse = t[t.instance != "dense"]
    assert (sparse.fwd_need > 0).all() and sparse.fwd_bound_over_target.notna().all()


def test_dense_causal_takes_its_own_training_target(bound):
    """Dense causal's fwd+bwd target is 1.3x SDPA's flash backend, not Flex's 3x."""
    rows = _rows("train-32768-h200.csv")
    ok = rows[(rows.status == "ok") & (rows.pattern == "dense") & (rows["pass"] == "fwd+bwd")]
    flash = ok[ok.impl == "sdpa-flash"].groupby("D").median_ms.min()
    dense = bound[bound.instance == "dense"].set_index("D")
    assert dense.target.to_dict() == pytest.approx((flash / 1.3).to_dict())


def test_the_summary_counts_the_table(bound):
    s = _script()
    rows = _rows("train-32768-h200.csv")
    lines = s.summary(bound, rows)
    sparse = bound[bound.instance != "dense"]
    assert any(line.startswith(f"sparse fwd+bwd at 3x Flex (or 50% of its floor): {int((sparse.need <= 1).sum())} of "
                               f"{len(sparse)} met ({int((sparse.need_capped <= 1).sum())} with the floor clause as a cap")
               for line in lines)
    dense = [line for line in lines if line.startswith("dense causal D=128")]
    fb = rows[(rows.status == "ok") & (rows.pattern == "dense") & (rows.D == 128)].groupby(["pass", "impl"]).median_ms.min()
    assert len(dense) == 1 and f"bwd / fwd {fb['bwd', 'fast-tc'] / fb['fwd', 'fast-tc']:.2f}" in dense[0]
    fwd_only = s.summary(s.table(_rows("llm-h200.csv"), T=32768), _rows("llm-h200.csv").query("T == 32768"))
    assert not any("fwd+bwd" in line for line in fwd_only) and any("fwd vs cuDNN" in line for line in fwd_only)


def test_the_capped_reading_never_asks_more_than_half_the_floor(bound):
    """The floor clause as a cap: the fwd+bwd target is the slower of Flex / 3 and twice the floor, so it is never
    stricter than the literal one, and it differs only where Flex / 3 lies between the floor and twice it."""
    sparse = bound[bound.instance != "dense"]
    capped = sparse.fwd_bwd / sparse.need_capped
    assert (capped >= sparse.target * (1 - 1e-12)).all()
    assert (capped >= 2 * sparse.floor_fwd_bwd * (1 - 1e-12)).all()
    between = (sparse.flex_fwd_bwd / 3 >= sparse.floor_fwd_bwd) & (sparse.flex_fwd_bwd / 3 < 2 * sparse.floor_fwd_bwd)
    assert between.any()  # block-diagonal 16 at D=64 on the committed rows
    assert ((capped > sparse.target * (1 + 1e-12)) == between).all()
    dense = bound[bound.instance == "dense"]
    assert (dense.need_capped == dense.need).all()


def test_the_targets_against_one_launch_s_read():
    """--read: each pass's bytes read by one launch under the protocol (the floor file's points), and the targets that
    ask less time than that: block-diagonal 16's fwd+bwd at D=64 (3x Flex, 0.185 ms, against a 0.190 ms read)."""
    from attnbench.devtools import read_time

    s = _script()
    t = s.table(_rows("train-32768-h200.csv"), read=read_time(pd.read_csv(ROOT / "results" / "floor-h200.csv")))
    sparse = t[t.instance != "dense"].set_index(["instance", "D"])
    assert (sparse.fwd_bwd_read > sparse.fwd_read).all()  # the training step moves more bytes than its forward
    assert (sparse.target_below_read == (sparse.target < sparse.fwd_bwd_read)).all()
    assert sparse.loc[("block_diagonal(block=16)", 64), "target_below_read"]
    assert not sparse.loc[("window(window=4096)", 64), "target_below_read"]
    # D=128 moves twice D=64's bytes: a longer read, and less than twice as long (a launch's fixed part)
    d64, d128 = sparse.xs(64, level="D").fwd_read.iloc[0], sparse.xs(128, level="D").fwd_read.iloc[0]
    assert d64 < d128 < 2 * d64
    lines = s.summary(t, _rows("train-32768-h200.csv"))
    misses = int((sparse.need > 1).sum())  # the committed rows' misses of the literal reading
    assert f"  of its {misses} misses, 1 ask less time than one launch that reads the pass's bytes" in lines
