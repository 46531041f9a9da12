"""scripts/decode_targets.py: the serving targets counted over decode rows (a host count, no GPU)."""
import numpy as np
import pandas as pd
import pytest
from scriptmod import ROOT, script

dt = script("decode_targets")


def _row(impl, pattern, T, ms, floor, Tq=1, B=1, status="ok", cache_lens=np.nan, label=None):
    return dict(impl=impl, pattern=pattern, label=label or pattern, B=B, Tq=Tq, T=T, cache_lens=cache_lens, H=32,
                H_kv=8, D=128, dtype="bfloat16", status=status, median_ms=ms, floor_ms=floor)


def _rows():
    return pd.DataFrame([
        # dense at T=32768: ours 1.0 against SDPA 1.1 (cuDNN) and 1.2 (flash), the floor 0.95 of it
        _row("fast-decode", "dense", 32768, 1.0, 0.95), _row("sdpa-cudnn", "dense", 32768, 1.1, 0.95),
        _row("sdpa-flash", "dense", 32768, 1.2, 0.95),
        # dense below T=32768: no dense target applies
        _row("fast-decode", "dense", 4096, 0.2, 0.1), _row("sdpa-cudnn", "dense", 4096, 0.1, 0.1),
        # streaming: 15 us against Flex's 100, floor 1 us (so 10 us counts), and the same at T=1048576, 5% slower
        _row("fast-decode", "streaming", 4096, 0.015, 0.001), _row("flex", "streaming", 4096, 0.1, 0.001),
        _row("fast-decode", "streaming", 1048576, 0.01575, 0.001),
        _row("flex", "streaming", 1048576, 0.2, 0.001, status="failed"),  # a failed peer is no peer
        # window at Tq=16: fast-tc serves it faster than fast-decode; Flex at 40 us asks 8 us, below the 10 us floor
        _row("fast-decode", "window", 4096, 0.03, 0.004, Tq=16), _row("fast-tc", "window", 4096, 0.02, 0.004, Tq=16),
        _row("flex", "window", 4096, 0.04, 0.004, Tq=16),
    ])


def _case(t, pattern, T, Tq=1):
    x = t[(t.pattern == pattern) & (t["T"] == T) & (t.Tq == Tq)]
    assert len(x) == 1
    return x.iloc[0]


def test_dense_against_sdpa_and_the_bandwidth_from_32768_keys():
    t = dt.table(_rows())
    d = _case(t, "dense", 32768)
    assert d.vs_sdpa == pytest.approx(1.1) and d.share == pytest.approx(0.95)
    assert np.isnan(_case(t, "dense", 4096).vs_sdpa) and np.isnan(_case(t, "dense", 4096).share)


def test_sparse_against_flex_and_the_floor_of_10_us():
    t = dt.table(_rows())
    s = _case(t, "streaming", 4096)
    assert s.vs_flex == pytest.approx(0.1 / 0.015) and s.over_floor == pytest.approx(1.5)
    assert s.flex_target_below_floor == 0
    assert np.isnan(_case(t, "streaming", 1048576).vs_flex)  # Flex failed there
    assert _case(t, "streaming", 1048576).flat == pytest.approx(1.05)


def test_the_fastest_of_the_given_implementations_is_ours():
    t = dt.table(_rows(), ("fast-decode", "fast-tc"))
    w = _case(t, "window", 4096, Tq=16)
    assert w.impl == "fast-tc" and w.vs_flex == pytest.approx(2.0) and w.flex_target_below_floor == 1
    assert _case(dt.table(_rows()), "window", 4096, Tq=16).impl == "fast-decode"


def test_the_summary_counts_what_meets_each_target():
    s = dt.summary(dt.table(_rows(), ("fast-decode", "fast-tc"))).set_index(["target", "Tq"])
    assert tuple(s.loc[("dense: at least SDPA's best backend (T >= 32768)", 1), ["met", "of"]]) == (1, 1)
    assert tuple(s.loc[("sparse: at least 5x Flex", 1), ["met", "of"]]) == (1, 1)
    flex16 = s.loc[("sparse: at least 5x Flex", 16)]
    assert (flex16.met, flex16.of, flex16.misses_below_floor) == (0, 1, 1)
    # streaming: 15 us is 1.5x the 10 us floor (met); 15.75 us at T=1048576 is 1.575x (missed)
    assert tuple(s.loc[("sparse: within 1.5x of max(floor, 10 us)", 1), ["met", "of"]]) == (1, 2)
    assert tuple(s.loc[("streaming at T=1048576 within 10% of T=4096", 1), ["met", "of"]]) == (1, 1)


def test_the_committed_decode_rows_count_consistently():
    rows = pd.read_csv(ROOT / "results" / "decode-h200.csv", dtype={"git_commit": str})
    t = dt.table(rows)
    sparse = t[t.pattern != "dense"]
    assert (sparse.over_floor == sparse.median_ms / np.maximum(sparse.floor_ms, 0.010)).all()
    assert t[t.pattern == "dense"].vs_flex.isna().all() and t[t["T"] < 32768].vs_sdpa.isna().all()
    s = dt.summary(t)
    for (name, col, _), tq in [(x, q) for x in dt.TARGETS for q in (1, 16)]:
        got = s[(s.target == name) & (s.Tq == tq)]
        assert got.of.sum() == t[(t.Tq == tq) & t[col].notna()].shape[0]


def test_a_ratio_against_a_peer_run_at_another_commit_is_flagged_and_counted():
    rows = _rows().assign(git_commit="aaa")
    rows.loc[(rows.impl == "flex") & (rows.pattern == "window"), "git_commit"] = "bbb"  # Flex's window row: elsewhere
    rows.loc[(rows.impl == "sdpa-flash"), "git_commit"] = "ccc"  # not the fastest SDPA backend: no matter
    t = dt.table(rows, ("fast-decode", "fast-tc"))
    assert _case(t, "streaming", 4096).flex_same_commit == 1 and _case(t, "window", 4096, Tq=16).flex_same_commit == 0
    assert _case(t, "dense", 32768).sdpa_same_commit == 1  # cuDNN's row, the fastest, is ours' commit
    assert np.isnan(_case(t, "dense", 4096).sdpa_same_commit) and np.isnan(_case(t, "dense", 32768).flex_same_commit)
    s = dt.summary(t).set_index(["target", "Tq"])
    assert s.loc[("sparse: at least 5x Flex", 16), "peer_other_commit"] == 1
    assert s.loc[("sparse: at least 5x Flex", 1), "peer_other_commit"] == 0
    assert s.loc[("dense: at least SDPA's best backend (T >= 32768)", 1), "peer_other_commit"] == 0
    rows.loc[rows.impl == "sdpa-cudnn", "git_commit"] = "ddd"
    assert _case(dt.table(rows), "dense", 32768).sdpa_same_commit == 0
    assert "flex_same_commit" not in dt.table(_rows())  # rows without commits: no such column


def test_no_rows_of_the_implementation_is_an_error(tmp_path, capsys):
    p = tmp_path / "x.csv"
    pd.DataFrame([{**_row("flex", "streaming", 4096, 0.1, 0.001), "family": "peer", "causal": True}]).to_csv(p, index=False)
    assert dt.main([str(p)]) == 1
    assert "no rows with status ok of fast-decode" in capsys.readouterr().err


def _floor(empty=0.003, r4=0.006, r32=0.015, r128=None):
    """attnbench floor's one-launch rows (and a two-launch one, which the read leaves out); with ``r128`` the
    128 MiB read too."""
    mib = 1 << 20
    return pd.DataFrame([dict(what="one empty launch", launches=1, bytes=0, median_ms=empty),
                         dict(what="two empty launches", launches=2, bytes=0, median_ms=1.0),
                         dict(what="read 4 MiB", launches=1, bytes=4 * mib, median_ms=r4),
                         dict(what="read 32 MiB", launches=1, bytes=32 * mib, median_ms=r32)]
                        + ([dict(what="read 128 MiB", launches=1, bytes=128 * mib, median_ms=r128)] if r128 else []))


def test_the_one_launch_read_interpolates_and_goes_on_at_the_rows_own_bandwidth():
    read = dt.read_time(_floor())
    mib = 1 << 20
    got = read([0, 2 * mib, 18 * mib, 32 * mib, 64 * mib], [1e-9] * 5)
    # halfway to 4 MiB, halfway from 4 to 32 MiB, then 32 MiB more at 1e-9 ms a byte
    assert got == pytest.approx([0.003, 0.0045, 0.0105, 0.015, 0.015 + 32 * mib * 1e-9])
    with pytest.raises(ValueError, match="read 32 MiB"):
        dt.read_time(_floor().iloc[:3])


def test_a_longer_read_where_the_file_has_it_replaces_the_rows_bandwidth():
    mib = 1 << 20
    read = dt.read_time(_floor(r128=0.045))
    got = read([32 * mib, 80 * mib, 128 * mib, 256 * mib], [1e-9] * 4)
    # halfway from 32 to 128 MiB, then past 128 MiB at 1e-9 ms a byte
    assert got == pytest.approx([0.015, 0.030, 0.045, 0.045 + 128 * mib * 1e-9])


def test_the_read_at_each_size_is_the_faster_of_plain_and_evict_first():
    """Where the floor file also times each read under L2's evict-first policy, the one-launch read at that size is
    the faster of the two; a file with only evict-first reads is still refused for its plain ones."""
    mib = 1 << 20
    rows = pd.concat([_floor(r128=0.045), pd.DataFrame([
        dict(what="read 32 MiB, L2 evict-first", launches=1, bytes=32 * mib, median_ms=0.013),
        dict(what="read 128 MiB, L2 evict-first", launches=1, bytes=128 * mib, median_ms=0.050)])])
    read = dt.read_time(rows)
    assert read([32 * mib, 128 * mib], [1e-9] * 2) == pytest.approx([0.013, 0.045])
    with pytest.raises(ValueError, match="read 32 MiB"):
        dt.read_time(rows[rows["what"] != "read 32 MiB"])


def test_dense_misses_whose_share_asks_less_than_a_read_are_counted():
    mib = 1 << 20
    rows = _rows()
    rows["bytes_floor"] = 128 * mib
    # dense at 32768: floor 0.95 ms, so 90% asks 1.056 ms; a read of 1.0 ms is faster, one of 1.1 ms is not
    t = dt.table(rows, read=dt.read_time(_floor(r128=1.0)))
    assert _case(t, "dense", 32768).share_target_below_read == 0
    assert np.isnan(_case(t, "dense", 4096).share_target_below_read)  # no share target below 32768 keys
    t2 = dt.table(rows, read=dt.read_time(_floor(r128=1.1)))
    assert _case(t2, "dense", 32768).share_target_below_read == 1
    summ = dt.summary(t2).set_index(["target", "Tq"])
    assert summ.loc[("dense: at least 90% of the measured bandwidth (T >= 32768)", 1), "misses_below_read"] == 0


def test_the_sparse_misses_whose_target_asks_less_than_a_read_are_counted():
    mib = 1 << 20
    rows = _rows()
    rows["bytes_floor"] = 32 * mib  # a 32 MiB read takes 15 us
    t = dt.table(rows, ("fast-decode", "fast-tc"), dt.read_time(_floor()))
    s = _case(t, "streaming", 1048576)
    # 1.5 x 10 us asks 15 us: not below the 15 us read; Flex failed there, so no 5x target
    assert s.read_ms == pytest.approx(0.015) and s.floor_target_below_read == 0
    assert np.isnan(s.flex_target_below_read)
    w = _case(t, "window", 4096, Tq=16)  # Flex / 5 = 8 us, below the read
    assert w.flex_target_below_read == 1
    assert np.isnan(_case(t, "dense", 32768).floor_target_below_read)
    summ = dt.summary(t).set_index(["target", "Tq"])
    assert summ.loc[("sparse: at least 5x Flex", 16), "misses_below_read"] == 1
    assert summ.loc[("sparse: within 1.5x of max(floor, 10 us)", 1), "misses_below_read"] == 0
    # with the 32 MiB read at 16 us, the streaming miss asks less than the read
    t2 = dt.table(rows, ("fast-decode", "fast-tc"), dt.read_time(_floor(r32=0.016)))
    assert dt.summary(t2).set_index(["target", "Tq"]).loc[
        ("sparse: within 1.5x of max(floor, 10 us)", 1), "misses_below_read"] == 1


def test_a_floor_file_without_its_reads_is_an_error(tmp_path, capsys):
    p = tmp_path / "floor.csv"
    _floor().iloc[:2].to_csv(p, index=False)
    assert dt.main([str(ROOT / "results" / "decode-h200.csv"), "--read", str(p)]) == 1
    assert "--read" in capsys.readouterr().err
