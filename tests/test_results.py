"""The results CSV: schema, provenance, arithmetic of the derived columns, the writer."""
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "data"))

from attnbench.patterns import BadInput, make_mask  # noqa: E402
from attnbench.results import ADDED, COLUMNS, STATUSES, ResultWriter, git_commit, read_results, row_key  # noqa: E402

SMALL = Path(__file__).parent / "data" / "small.csv"
REQUIRED = """timestamp gpu sm_count driver cuda_runtime cupy torch git_commit config impl family pattern label
causal window sink block dilation window_blocks global_blocks random_blocks prefix doc_mean params B H T D dtype pairs density flops bytes_floor status reason rel_err
tolerance median_ms p20_ms p80_ms samples tflops peak_tflops peak_tbps floor_ms roofline compile_s
setup_s""".split()
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def rows(path=SMALL):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """small.csv's sweep run again now (fake implementations, host inputs): rows whose derived columns the code
    computes in this test run, not the committed file's."""
    import make_small_csv

    path = tmp_path_factory.mktemp("fresh") / "small.csv"
    make_small_csv.build(path)
    return path


@pytest.fixture(params=["committed", "fresh"])
def small(request):
    return SMALL if request.param == "committed" else request.getfixturevalue("fresh")


def test_header_holds_every_required_column():
    with open(SMALL, newline="") as f:
        header = next(csv.reader(f))
    # this version's columns, or an older version's: less columns added since (the pass), which read back
    assert [c for c in COLUMNS if c in header] == header and set(COLUMNS) - set(header) <= set(ADDED)
    assert [c for c in REQUIRED if c not in header] == []


def test_every_row_carries_provenance_and_a_status(small):
    assert rows(small)
    for r in rows(small):
        for c in ("timestamp", "gpu", "sm_count", "driver", "cuda_runtime", "cupy", "git_commit", "config"):
            assert r[c] != "", (c, r)
        assert r["gpu"] == "test-fixture"
        assert r["status"] in STATUSES
        assert (r["reason"] == "") == (r["status"] == "ok")


def test_derived_columns_follow_spec_section_3(small):
    seen = 0
    for r in rows(small):
        if r["pairs"] == "":
            assert r["status"] == "skipped"
            continue
        p = json.loads(r["params"])
        mask = make_mask(r["pattern"], int(r["T"]), r["causal"] == "True", **p)
        B, H, T, D = (int(r[c]) for c in "BHTD")
        assert int(r["pairs"]) == mask.pairs
        assert int(r["flops"]) == 4 * D * mask.pairs * B * H
        assert int(r["bytes_floor"]) == 4 * B * H * T * D * ITEMSIZE[r["dtype"]]
        for k in ("window", "sink", "block", "dilation"):
            assert r[k] == (str(p[k]) if k in p else "")
        peak = float(r["peak_tflops"])
        floor = max(int(r["flops"]) / (peak * 1e12), int(r["bytes_floor"]) / (float(r["peak_tbps"]) * 1e12)) * 1e3
        assert float(r["floor_ms"]) == pytest.approx(floor)
        if r["status"] == "ok":
            med = float(r["median_ms"])
            assert float(r["p20_ms"]) <= med <= float(r["p80_ms"])
            assert float(r["tflops"]) == pytest.approx(int(r["flops"]) / (med * 1e-3) / 1e12)
            assert float(r["roofline"]) == pytest.approx(floor / med)
            assert float(r["rel_err"]) <= float(r["tolerance"])
            assert isinstance(json.loads(r["setup_s"]), dict)
            seen += 1
    assert seen > 0


def test_no_row_twice():
    keys = [row_key(r) for r in rows()]
    assert len(keys) == len(set(keys))


def test_float32_rows_use_the_float32_peak_and_16_bit_rows_the_tensor_core_peak(small):
    peaks = {(r["dtype"], r["peak_tflops"]) for r in rows(small)}
    assert peaks == {("float32", "10.0"), ("float16", "100.0")}


def test_the_committed_fixture_is_what_the_code_writes_now(fresh):
    """small.csv regenerated (tests/data/make_small_csv.py) holds the same rows with the same counts, floors, times
    and statuses: a change to what a row says shows here until the fixture is rebuilt."""
    cols = ("status", "pairs", "flops", "bytes_floor", "floor_ms", "median_ms", "tflops", "roofline", "peak_tflops",
            "peak_tbps", "reason")
    old = {row_key(r): tuple(r[c] for c in cols) for r in rows()}
    new = {row_key(r): tuple(r[c] for c in cols) for r in rows(fresh)}
    assert old.keys() == new.keys()
    assert {k: (old[k], new[k]) for k in old if old[k] != new[k]} == {}


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_git_commit_marks_a_modified_tree_dirty(tmp_path):
    assert git_commit(tmp_path) == "unknown"
    _git(tmp_path, "init", "-q")
    f = tmp_path / "a.txt"
    f.write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    clean = git_commit(tmp_path)
    assert len(clean) == 12 and not clean.endswith("-dirty")
    f.write_text("two\n")
    assert git_commit(tmp_path) == clean + "-dirty"


def _row(**kw):
    r = dict(impl="x", pattern="dense", params="{}", causal=True, B=1, H=1, T=8, D=4, dtype="float32",
             status="ok")
    r.update(kw)
    return r


def test_writer_refuses_to_clobber_and_resumes_without_duplicates(tmp_path):
    p = tmp_path / "r.csv"
    with ResultWriter(p) as w:
        w.write([_row(T=8), _row(T=16)])
    with pytest.raises(BadInput, match="--resume"):
        ResultWriter(p)
    with ResultWriter(p, resume=True) as w:
        assert w.is_done(_row(T=8)) and not w.is_done(_row(T=32))
        w.write([_row(T=8), _row(T=32)])
    assert sorted(int(r["T"]) for r in csv.DictReader(io.StringIO(Path(p).read_text()))) == [8, 16, 32]
    with ResultWriter(p, overwrite=True) as w:
        pass  # no row: the old file stays as it was
    assert len(list(csv.DictReader(io.StringIO(Path(p).read_text())))) == 3
    with ResultWriter(p, overwrite=True) as w:
        assert len(list(csv.DictReader(io.StringIO(Path(p).read_text())))) == 3  # untouched until rows arrive
        w.write([_row(T=64)])
        assert [int(r["T"]) for r in csv.DictReader(io.StringIO(Path(p).read_text()))] == [64]
    assert [int(r["T"]) for r in csv.DictReader(io.StringIO(Path(p).read_text()))] == [64]
    assert [q.name for q in tmp_path.iterdir()] == ["r.csv"]  # no temporary file left


def test_writer_refuses_to_resume_a_csv_of_other_columns(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(BadInput, match="columns"):
        ResultWriter(p, resume=True)


def test_read_results_names_a_missing_or_foreign_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        read_results(tmp_path / "nope.csv")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(BadInput, match="missing columns"):
        read_results(tmp_path / "x.csv")
    df = read_results(SMALL)
    assert df["causal"].dtype == bool


def test_a_row_written_before_a_parameter_was_declared_keeps_its_identity():
    """Resume: dilated rows from before `levels` existed are the same instances as new ones."""
    old = {"impl": "fast-tc", "pattern": "dilated", "params": '{"dilation":2,"window":512}', "causal": "True",
           "B": "1", "H": "16", "T": "32768", "D": "64", "dtype": "bfloat16"}
    new = dict(old, params='{"dilation":2,"levels":[],"window":512}', causal=True, B=1, H=16, T=32768, D=64)
    assert row_key(old) == row_key(new)
    assert row_key(old) != row_key(dict(new, params='{"dilation":2,"levels":[[4,2]],"window":512}'))
