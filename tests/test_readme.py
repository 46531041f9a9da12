"""README summary from CSVs: content, idempotence, --check, markers."""
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from attnbench.cli import main
from attnbench.patterns import BadInput
from attnbench.readme import END, START, render, update_readme

SMALL = Path(__file__).parent / "data" / "small.csv"
README = f"# title\n\nintro\n\n{START}\nold summary\n{END}\n\nafter\n"


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(SMALL, tmp_path / "small.csv")
    (tmp_path / "README.md").write_text(README)
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(main, ["readme", *args])


def test_readme_is_rewritten_between_markers_and_idempotent(work):
    r = invoke("small.csv")
    assert r.exit_code == 0, r.output
    text = (work / "README.md").read_text()
    assert text.startswith("# title\n\nintro\n\n" + START) and text.endswith(END + "\n\nafter\n")
    assert "old summary" not in text
    assert "GPU: test-fixture" in text and "commit: test-fixture" in text
    assert "`python tests/data/make_small_csv.py`" in text
    assert invoke("small.csv").exit_code == 0
    assert (work / "README.md").read_text() == text
    assert not update_readme(work / "README.md", ["small.csv"])
    r = invoke("small.csv", "--check")
    assert r.exit_code == 0 and "up to date" in r.stderr


def test_check_catches_a_stale_table(work):
    invoke("small.csv")
    before = (work / "README.md").read_text()
    df = pd.read_csv(work / "small.csv", keep_default_na=False, dtype=str)
    i = df.index[(df["status"] == "ok") & (df["impl"] == "fake-exact")][0]
    df.loc[i, "median_ms"] = repr(float(df.loc[i, "median_ms"]) * 2)
    df.to_csv(work / "small.csv", index=False)
    r = invoke("small.csv", "--check")
    assert r.exit_code == 1 and "stale" in r.stderr
    assert (work / "README.md").read_text() == before  # --check writes nothing


def test_missing_markers_is_an_error_naming_them(work):
    (work / "README.md").write_text("# no markers\n")
    r = invoke("small.csv")
    assert r.exit_code == 2
    assert START in r.stderr and END in r.stderr and "Traceback" not in r.output
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


def test_readme_tables_match_the_committed_results(monkeypatch):
    """CI: the README's summary is what `attnbench readme --check` makes of the committed CSVs."""
    import re

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)  # the summary names the CSVs as the command was given them
    text = (root / "README.md").read_text()
    m = re.search(r"generated by `attnbench readme ([^`]+)`", text)
    assert m, "the README's summary was not generated from results CSVs"
    csvs = m.group(1).split()
    assert csvs and all((root / c).is_file() and c.startswith("results/") for c in csvs)
    r = CliRunner().invoke(main, ["readme", *csvs, "--check"])
    assert r.exit_code == 0, r.output
