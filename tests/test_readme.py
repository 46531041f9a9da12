"""README headline and results/README.md full tables from CSVs: content, idempotence, --check, markers."""
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from attnbench.cli import main
from attnbench.patterns import BadInput
from attnbench.readme import END, HEAD_END, HEAD_START, RATIO, START, headline_T, render, render_headline, update_readme

SMALL = Path(__file__).parent / "data" / "small.csv"
README = f"# title\n\nintro\n\n{HEAD_START}\nold headline\n{HEAD_END}\n\nafter\n"
FULL = f"# results\n\n{START}\nold summary\n{END}\n"


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A README with the headline markers, results/README.md with the full tables' markers."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(SMALL, tmp_path / "small.csv")
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "README.md").write_text(FULL)
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(main, ["readme", *args])


def test_readme_is_rewritten_between_markers_and_idempotent(work):
    r = invoke("small.csv")
    assert r.exit_code == 0, r.output
    text = (work / "README.md").read_text()
    full = (work / "results" / "README.md").read_text()
    assert text.startswith("# title\n\nintro\n\n" + HEAD_START) and text.endswith(HEAD_END + "\n\nafter\n")
    assert full.startswith("# results\n\n" + START) and full.endswith(END + "\n")
    assert "old summary" not in full and "old headline" not in text
    # the headline in the README, the full tables in results/README.md
    assert "| pattern | fake-exact |" in text and "#### fake-exact" not in text
    assert "GPU: test-fixture" in full and "commit: test-fixture" in full and "| pattern |" not in full
    assert "`python tests/data/make_small_csv.py`" in full
    # figure links relative to each file: the PNGs `attnbench plot small.csv --out-dir .` writes
    assert "](small_float32_D16_B1_H2_best-attnbench-vs-dense.png)" in text
    assert "[runtime](../small_float32_D16_B1_H2_runtime.png)" in full
    assert invoke("small.csv").exit_code == 0
    assert (work / "README.md").read_text() == text and (work / "results" / "README.md").read_text() == full
    assert not update_readme(work / "README.md", ["small.csv"])
    r = invoke("small.csv", "--check")
    assert r.exit_code == 0 and "README.md is up to date" in r.stderr and "results/README.md is up to date" in r.stderr


def test_check_catches_a_stale_table(work):
    invoke("small.csv")
    before = (work / "README.md").read_text()
    df = pd.read_csv(work / "small.csv", keep_default_na=False, dtype=str)
    i = df.index[(df["status"] == "ok") & (df["impl"] == "fake-exact") & (df["T"] == "128")][0]
    df.loc[i, "median_ms"] = repr(float(df.loc[i, "median_ms"]) * 2)
    df.to_csv(work / "small.csv", index=False)
    r = invoke("small.csv", "--check")
    assert r.exit_code == 1 and "error: README.md is stale" in r.stderr and "error: results/README.md is stale" in r.stderr
    assert (work / "README.md").read_text() == before  # --check writes nothing


@pytest.mark.parametrize("stale", ["README.md", "results/README.md"])
def test_check_catches_either_file_stale(work, stale):
    assert invoke("small.csv").exit_code == 0
    path = work / stale
    path.write_text(path.read_text().replace("0.5x", "0.6x").replace("GPU: test-fixture", "GPU: edited"))
    r = invoke("small.csv", "--check")
    fresh = ({"README.md", "results/README.md"} - {stale}).pop()
    assert r.exit_code == 1, r.output
    assert f"error: {stale} is stale: run `attnbench readme small.csv --readme {stale}`" in r.stderr
    assert f"{fresh} is up to date" in r.stderr
    # the file named alone is checked alone
    assert invoke("small.csv", "--check", "--readme", fresh).exit_code == 0


def test_a_refused_file_leaves_every_file_as_it_was(work):
    (work / "results" / "README.md").write_text("# no markers\n")
    r = invoke("small.csv")
    assert r.exit_code == 2 and HEAD_START in r.stderr and START in r.stderr
    assert (work / "README.md").read_text() == README


def test_missing_markers_is_an_error_naming_them(work):
    (work / "README.md").write_text("# no markers\n")
    r = invoke("small.csv")
    assert r.exit_code == 2
    assert all(m in r.stderr for m in (START, END, HEAD_START, HEAD_END)) and "Traceback" not in r.output
    r = invoke("nope.csv")
    assert r.exit_code == 2 and "nope.csv does not exist" in r.stderr


def _table_after(text, heading, title):
    """The data rows of the table under ``title`` inside the section ``heading``."""
    sec = text[text.index(heading):]
    sec = sec[sec.index(title):]
    rows = []
    for line in sec.splitlines()[2:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[2:] if rows and rows[0][0] == "T" else rows[1:]


def test_tables_hold_speedup_best_peer_and_status():
    text = render([str(SMALL)])
    df = pd.read_csv(SMALL, keep_default_na=False)
    heading = "#### fake-exact (attnbench): float32, B=1 H=2 D=16"
    rows = _table_after(text, heading, "**window(window=16), causal**")
    assert [r[0] for r in rows] == ["32", "64", "128"]
    sel = lambda impl, pattern, T: df[(df["impl"] == impl) & (df["pattern"] == pattern) & (df["T"] == T)  # noqa: E731
                                      & (df["dtype"] == "float32")]
    for r in rows:
        T = int(r[0])
        dense = float(sel("fake-exact", "dense", T)["median_ms"].iloc[0])
        win = float(sel("fake-exact", "window", T)["median_ms"].iloc[0])
        assert r[1] == f"{dense:.4g}" and r[2] == f"{win:.4g}" and r[3] == f"{dense / win:.2f}x"
        peers = sel("fake-peer", "window", T)
        assert r[6] == f"fake-peer {float(peers['median_ms'].iloc[0]):.4g}"
    rows = _table_after(text, heading, "**block_diagonal(block=64), causal**")
    assert rows[0][0] == "32" and rows[0][2] == "skipped" and rows[0][6] == "—"
    assert "skipped at T=32: T=32 is not a multiple of block=64" in text
    # implementations never timed in a group get a line, not a table
    assert "#### fake-absent" not in text
    assert "- fake-absent: skipped at T=32: T=32 is not a multiple of block=64; skipped at T=32, 64, 128: fake: needs" in text
    # peers appear through the best-peer column, not tables of their own
    assert "#### fake-peer" not in text


def test_a_section_per_csv(work):
    shutil.copy(SMALL, work / "other.csv")
    text = render(["small.csv", "other.csv"])
    assert text.index("### seed: `small.csv`") < text.index("### seed: `other.csv`")
    with pytest.raises(BadInput, match="markers"):
        (work / "R.md").write_text(f"{END}\n{START}\n")
        update_readme(work / "R.md", ["small.csv"])
    # the headline too: a section per CSV, in the order given
    text = render_headline(["small.csv", "other.csv"])
    assert text.index("](small_float32") < text.index("](other_float32")


def test_readme_tables_match_the_committed_results(monkeypatch):
    """CI: the README's headline and results/README.md's tables are what `attnbench readme --check`
    makes of the committed CSVs each names (the headline may show fewer of them than the full
    tables), and every figure they show is committed."""
    import re

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)  # the summary names the CSVs as the command was given them
    lists = {}
    for name in ("README.md", "results/README.md"):
        text = (root / name).read_text()
        m = re.search(r"generated by `attnbench readme ([^`]+)`", text)
        assert m, f"{name}'s generated part was not generated from results CSVs"
        csvs = lists[name] = m.group(1).split()
        assert csvs and all((root / c).is_file() and c.startswith("results/") for c in csvs)
        for link in re.findall(r"\]\(([^)]+\.png)\)", text):
            assert (root / name).parent.joinpath(link).is_file(), f"{name} shows {link}, which is not committed"
        r = CliRunner().invoke(main, ["readme", *csvs, "--readme", name, "--check"])
        assert r.exit_code == 0, r.output
        assert f"{name} is up to date" in r.stderr
    # the full tables hold every CSV the headline shows
    assert set(lists["README.md"]) <= set(lists["results/README.md"])


def _headline_rows(text, title):
    """The header and rows of the headline table under the bold line starting with ``title``."""
    sec = text[text.index(title):]
    table = [line for line in sec.splitlines()[2:] if line.startswith("|")]
    table = table[:next((n for n, line in enumerate(sec.splitlines()[2:]) if not line.startswith("|")), len(table))]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    return rows[0], rows[2:]


def test_headline_table_cells_columns_and_ratio():
    text = render_headline([str(SMALL)])
    df = pd.read_csv(SMALL, keep_default_na=False)
    g = df[df["dtype"] == "float32"]
    T = headline_T(g)
    assert T == 128  # the largest T with the most ok rows (T=64 has as many)
    header, rows = _headline_rows(text, f"**seed: float32, B=1 H=2 D=16, T={T}** (test-fixture)")
    # attnbench's implementations first (CSV order, failures included), then the peers, marked
    assert header == ["pattern", "fake-exact", "fake-slow", "fake-wrong", "fake-oom", "fake-peer (peer)", RATIO]
    assert [r[0] for r in rows] == ["dense", "window 16", "streaming 4+16", "block_diagonal 16", "block_diagonal 64"]
    at = g[g["T"] == T]
    for r in rows:
        label = {"dense": "dense", "window 16": "window(window=16)", "streaming 4+16": "streaming(sink=4,window=16)",
                 "block_diagonal 16": "block_diagonal(block=16)", "block_diagonal 64": "block_diagonal(block=64)"}[r[0]]
        ms = {i: float(at[(at["impl"] == i) & (at["label"] == label)]["median_ms"].iloc[0])
              for i in ("fake-exact", "fake-slow", "fake-peer")}
        assert r[1] == f"{ms['fake-exact']:.4g}" and r[2] == f"{ms['fake-slow']:.4g}"
        assert r[3] == r[4] == "failed"
        assert r[5] == f"**{ms['fake-peer']:.4g}**"  # the fastest, in bold
        ratio = ms["fake-peer"] / min(ms["fake-exact"], ms["fake-slow"])
        assert r[6] == f"{ratio:.2g}x" == "0.5x"
    assert "Failed at T=128: fake-wrong: relative error 0.5 above tolerance 1e-05; fake-oom: MemoryError" in text
    assert ("Not run at T=128: fake-absent: fake: needs a library that is not installed; "
            "fake-f16: dtype=float32 is not supported by fake-f16") in text
    assert "![seed, float32 D=16: fake-exact," in text


def test_headline_ratio_when_attnbench_is_faster_and_without_a_peer(tmp_path):
    df = pd.read_csv(SMALL, keep_default_na=False, dtype=str)
    peer = df["impl"] == "fake-peer"
    df.loc[peer, "median_ms"] = [repr(float(v) * 30) if v else v for v in df.loc[peer, "median_ms"]]
    no_peer = peer & df["label"].str.startswith("window")
    df.loc[no_peer, ["status", "reason", "median_ms"]] = ["skipped", "fake: no window here", ""]
    df.to_csv(tmp_path / "f.csv", index=False)
    header, rows = _headline_rows(render_headline([str(tmp_path / "f.csv")]), "**seed: float32")
    by = {r[0]: r for r in rows}
    assert by["dense"][1].startswith("**") and by["dense"][-1] == "15x"  # 30 * 0.5, two digits from 10 on
    assert by["window 16"][header.index("fake-peer (peer)")] == "—" and by["window 16"][-1] == "—"


def _serving_csv(path):
    """small.csv's fake-exact and fake-peer rows as a decode sweep: the same rows at Tq=1 and at Tq=16
    (median times doubled), H_kv=1 of H=2, and the Tq=1 rows again as a ragged batch (times tripled)."""
    df = pd.read_csv(SMALL)
    df = df[df["impl"].isin(["fake-exact", "fake-peer"]) & (df["dtype"] == "float32")]
    one = df.assign(Tq=1, H_kv=1, cache_lens="")
    sixteen = df.assign(Tq=16, H_kv=1, cache_lens="", median_ms=df["median_ms"] * 2)
    ragged = df.assign(Tq=1, H_kv=1, cache_lens=df["T"].map(lambda T: f"{T}:{T // 2}"), median_ms=df["median_ms"] * 3)
    pd.concat([sixteen, ragged, one]).to_csv(path, index=False)


def test_serving_shapes_get_sections_tables_and_figures_of_their_own(work):
    """A decode CSV: a section per (Tq, H_kv, ragged) shape, fewer queries first and the ragged batch
    after the uniform one, each table one row per T with that shape's times; figure links by shape."""
    _serving_csv(work / "serve.csv")
    text = render(["serve.csv"])
    titles = [line for line in text.splitlines() if line.startswith("### seed")]
    assert titles == ["### seed, Tq=1 H_kv=1: `serve.csv`", "### seed, Tq=1 H_kv=1, ragged: `serve.csv`",
                      "### seed, Tq=16 H_kv=1: `serve.csv`"]
    df = pd.read_csv(SMALL)
    dense = df[(df["impl"] == "fake-exact") & (df["pattern"] == "dense") & (df["dtype"] == "float32")]
    for title, factor in zip(titles, (1, 3, 2)):
        sec = text[text.index(title):]
        rows = _table_after(sec, "#### fake-exact (attnbench): float32, B=1 H=2 D=16", "**dense, causal**")
        assert [r[0] for r in rows] == ["32", "64", "128"]  # one row per T: no shape mixed in
        for r, ms in zip(rows, dense.sort_values("T")["median_ms"]):
            assert r[1] == f"{ms * factor:.4g}"
    assert "serve_float32_D16_B1_H2_Tq1-Hkv1-ragged_runtime.png" in text
    head = render_headline(["serve.csv"])
    assert head.index("**seed, Tq=1 H_kv=1:") < head.index("**seed, Tq=1 H_kv=1, ragged:") < head.index("**seed, Tq=16")


def test_serving_shapes_get_figures_of_their_own(work):
    from attnbench.plot import plot_csv

    _serving_csv(work / "serve.csv")
    names = {p.name for p in plot_csv(work / "serve.csv", work / "figs")}
    for tag in ("Tq1-Hkv1", "Tq1-Hkv1-ragged", "Tq16-Hkv1"):
        assert f"serve_float32_D16_B1_H2_{tag}_runtime.png" in names
    assert not any("_H2_runtime" in n for n in names)  # nothing left ungrouped
