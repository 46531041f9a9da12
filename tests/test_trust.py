"""Nothing lost, no false pass, no traceback: results files that survive kills and cuts, the
check and sweep verdicts, and every refused input or path ending in one `error:` line."""
import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import PEAKS, PROVENANCE, FakeTimer, fake_impls, host_inputs  # noqa: E402

from attnbench import check as check_mod  # noqa: E402
from attnbench import impls as impls_mod  # noqa: E402
from attnbench import sweep as sw  # noqa: E402
from attnbench.check import GateResult  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.errors import BadInput  # noqa: E402
from attnbench.results import COLUMNS, ResultWriter, read_results, row_key  # noqa: E402

DATA = Path(__file__).parent / "data"
SMALL = DATA / "small.csv"
ROOT = Path(__file__).parent.parent
SWEEP = ["--T-min", "32", "--T-max", "64", "--pattern", "dense", "--pattern", "window", "--pattern",
         "block_diagonal", "--window", "8", "--block", "16", "--D", "16"]
OK_IMPLS = ["--impl", "fake-exact", "--impl", "fake-peer"]


@pytest.fixture
def device(registry, monkeypatch):
    """The fakes stand in for the device; ``device["gpu"]`` names it."""
    state = {"gpu": PROVENANCE["gpu"], "made": 0}

    def context(seed, budget_s, command, progress, samples=None):
        state["made"] += 1
        impls = list(registry.values())
        return sw.Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE, gpu=state["gpu"]),
                          inputs=host_inputs, cleanup=lambda: None, seed=seed, budget_s=budget_s,
                          command=command, progress=progress, samples=samples)
    monkeypatch.setattr(sw, "device_context", context)
    return state


@pytest.fixture
def no_gpu(registry, monkeypatch):
    """No device here, whatever this machine has."""
    monkeypatch.setattr(impls_mod, "device_problem", lambda: "no CUDA device (test)")


def sweep(*args):
    return CliRunner().invoke(main, ["sweep", *map(str, args)])


def one_error(r, *words, code=2):
    """Exit ``code``, no traceback, the last stderr line one `error:` naming ``words``."""
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit))
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), r.stderr
    assert sum(ln.startswith(("error:", "Error:")) for ln in lines) == 1, r.stderr
    for w in words:
        assert w in lines[-1], (w, lines[-1])


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_whole(path, expect):
    """Parses with pandas; every (configuration, impl) exactly once, ``expect`` of them."""
    df = pd.read_csv(path)
    assert list(df.columns) == COLUMNS and len(df) == expect
    keys = [row_key(r) for r in rows(path)]
    assert len(set(keys)) == len(keys) == expect
    assert Path(path).read_bytes().endswith(b"\n")


# -- nothing lost ------------------------------------------------------------------------------

def test_a_sweep_killed_mid_row_resumes_with_every_finished_row_once(tmp_path):
    out = tmp_path / "r.csv"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, str(DATA / "slow_sweep.py")]
    p = subprocess.Popen(cmd + ["5", "0.05", *SWEEP, *OK_IMPLS, "--out", str(out)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "cut"  # five rows whole, the sixth half written
        p.send_signal(signal.SIGKILL)
    finally:
        p.communicate(timeout=30)  # waits and closes its pipes
    assert p.returncode == -signal.SIGKILL
    text = out.read_text()
    assert not text.endswith("\n") and text.count("\n") == 6  # header + 5 rows + half a row
    finished = text.splitlines(keepends=True)[1:6]

    r = subprocess.run(cmd + ["-", "0", *SWEEP, *OK_IMPLS, "--out", str(out), "--resume"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"warning: {out} line 7 is not a whole row: cut short" in r.stderr
    assert "checked 7, passed 7, failed 0, skipped 0, resumed 5" in r.stderr
    assert_whole(out, 12)
    assert out.read_text().splitlines(keepends=True)[1:6] == finished
    assert (tmp_path / "r.csv.partial").read_text() == text.splitlines(keepends=True)[-1] + "\n"


FULL = ["--T-min", 32, "--T-max", 64, "--pattern", "dense", "--pattern", "window", "--window", 8, "--D", 16,
        "--impl", "fake-exact", "--impl", "fake-slow", "--impl", "fake-peer"]


def full_csv(path, impls=None):
    """What ``sweep *FULL`` writes: 4 configurations x 3 implementations."""
    impls = impls or fake_impls()[:3]
    ctx = sw.Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                     cleanup=lambda: None)
    cases = sw.plan("seed", patterns=("dense", "window"), T_min=32, T_max=64, B=1, H=1, D=(16,), window=(8,))
    with ResultWriter(path) as w:
        sw.run_sweep(cases, impls, w, ctx)
    return cases, impls


@pytest.mark.parametrize("where", ["impl", "params", "T", "setup_s", "cr"])
def test_resume_sets_a_cut_last_row_aside_wherever_it_was_cut(tmp_path, device, where):
    out = tmp_path / "r.csv"
    full_csv(out)
    raw = out.read_bytes()
    last = raw.rstrip(b"\r\n").rfind(b"\n") + 1
    row = raw[last:]
    cut = {"impl": row.index(b"fake-"),                        # inside the key columns
           "params": row.index(b'"{') + 4,                     # inside a quoted field
           "T": row.index(b",1,1,64,16,") + 6,                    # inside the numbers of the key
           "setup_s": len(row) - 5,                            # inside the last field
           "cr": len(row) - 1}[where]                          # between \r and \n
    out.write_bytes(raw[:last + cut])
    n = raw[:last].count(b"\n")  # rows kept, header included
    r = sweep(*FULL, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert f"line {n + 1} is not a whole row" in r.stderr and "r.csv.partial" in r.stderr
    assert "checked 1, passed 1" in r.stderr
    assert_whole(out, 12)
    assert out.read_bytes()[:last] == raw[:last]


def test_resume_sets_aside_a_row_glued_to_a_cut_one(tmp_path, device):
    """A file an older version left: a cut row with the next row appended to it."""
    out = tmp_path / "r.csv"
    full_csv(out)
    lines = out.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3][:40] + lines[4]
    del lines[4]
    out.write_bytes(b"".join(lines))
    r = sweep(*FULL, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert "line 4 is not a whole row" in r.stderr and "fields where the header has" in r.stderr
    assert_whole(out, 12)


def test_overwrite_replaces_only_when_rows_arrive(tmp_path, no_gpu, monkeypatch):
    keep = tmp_path / "keep.csv"
    keep.write_bytes(SMALL.read_bytes())
    r = sweep("--out", keep, "--overwrite")
    one_error(r, "sweep needs a CUDA device", "no CUDA device (test)")
    assert keep.read_bytes() == SMALL.read_bytes()

    def broken(**kw):  # a device that fails while being set up
        raise RuntimeError("device lost")
    monkeypatch.setattr(sw, "device_context", broken)
    assert sweep("--out", keep, "--overwrite").exit_code == 1
    assert keep.read_bytes() == SMALL.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.csv"]


def test_no_gpu_refuses_before_any_file_and_after_bad_input(tmp_path, no_gpu, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_error(sweep("--T-min", 128, "--T-max", 4096), "sweep needs a CUDA device")
    assert list(tmp_path.iterdir()) == []
    one_error(sweep("--T-min", 4096, "--T-max", 128), "--T-min=4096")  # bad input first
    one_error(sweep("--impl", "nope"), "'--impl': 'nope' is not one of")


def test_resume_refuses_rows_of_another_gpu(tmp_path, device):
    out = tmp_path / "r.csv"
    full_csv(out)
    before = out.read_bytes()
    device["gpu"] = "Other GPU"
    r = sweep(*SWEEP, "--impl", "fake-exact", "--out", out, "--resume")
    one_error(r, str(out), "12 rows of 'test-fixture'", "'Other GPU'")
    assert out.read_bytes() == before


def test_retry_failed_replaces_the_failed_rows_only(tmp_path, device, registry):
    out = tmp_path / "r.csv"
    args = ["--T-min", 32, "--T-max", 64, "--pattern", "dense", "--pattern", "window", "--window", 8, "--D", 16,
            "--impl", "fake-exact", "--impl", "fake-wrong", "--out", out]
    assert sweep(*args).exit_code == 1
    first = rows(out)
    assert [x["status"] for x in first].count("failed") == 4
    one_error(sweep(*args[:-2], "--out", out, "--retry-failed"), "--retry-failed", "--resume")
    r = sweep(*args, "--resume")  # failed rows count as done without --retry-failed
    assert r.exit_code == 0 and "resumed 8" in r.stderr
    registry["fake-wrong"].factor = 1.0  # fixed
    r = sweep(*args, "--resume", "--retry-failed")
    assert r.exit_code == 0, r.output
    assert "checked 4, passed 4, failed 0, skipped 0, resumed 4" in r.stderr
    after = rows(out)
    assert_whole(out, 8)
    assert {x["status"] for x in after} == {"ok"}
    assert [x for x in after if x["impl"] == "fake-exact"] == [x for x in first if x["impl"] == "fake-exact"]


def test_a_retry_cut_short_leaves_both_rows_and_the_next_resume_keeps_the_new_one(tmp_path):
    out = tmp_path / "r.csv"
    base = dict(impl="x", pattern="dense", params="{}", causal=True, B=1, H=1, D=4, dtype="float32")
    with ResultWriter(out) as w:
        w.write([dict(base, T=8, status="failed", reason="old"), dict(base, T=16, status="ok")])
    w = ResultWriter(out, resume=True, retry_failed=True).open()
    w.write([dict(base, T=8, status="ok")])
    w._f.close()  # killed: close() never ran
    assert [x["status"] for x in rows(out)] == ["failed", "ok", "ok"]
    with ResultWriter(out, resume=True) as w:
        assert w.is_done(dict(base, T=8))
    assert [(x["T"], x["status"]) for x in rows(out)] == [("16", "ok"), ("8", "ok")]


def test_readme_and_plot_write_through_a_temporary_file(tmp_path, monkeypatch):
    from attnbench.readme import END, START

    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{START}\n{END}\n")
    readme.chmod(0o640)
    replaced = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (replaced.append(Path(b).name), real(a, b)))
    assert CliRunner().invoke(main, ["readme", str(SMALL), "--readme", str(readme)]).exit_code == 0
    assert replaced == ["README.md"] and readme.stat().st_mode & 0o777 == 0o640
    r = CliRunner().invoke(main, ["plot", str(SMALL), "--out-dir", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    assert len(replaced) == 1 + 10 and all(n.endswith(".png") for n in replaced[1:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "p"]
    assert not [p for p in (tmp_path / "p").iterdir() if p.name.startswith(".")]


# -- no false pass ---------------------------------------------------------------------------------

@pytest.fixture
def fake_gate(monkeypatch):
    def gate(impl, prob, seed=None):
        return GateResult(impl.factor == 1.0, 0.0 if impl.factor == 1.0 else 0.5, 1e-5,
                          "" if impl.factor == 1.0 else "relative error 0.5 above tolerance 1e-05")
    monkeypatch.setattr(check_mod, "gate", gate)


def check(*args):
    return CliRunner().invoke(main, ["check", *map(str, args)])


def test_check_counts_what_ran_and_passes_only_when_all_did(registry, fake_gate):
    r = check("--impl", "fake-exact", "--pattern", "dense", "--pattern", "block_diagonal", "--T", 7, "--T", 128)
    assert r.exit_code == 0, r.output
    # per dtype: dense at 2 sizes, block_diagonal's examples (block 1 at T=7; 16 and 8 at T=128)
    assert "checked 10, passed 10, failed 0, skipped 0" in r.output
    r = check("--impl", "fake-exact", "--impl", "fake-wrong", "--pattern", "dense", "--T", 8)
    one_error(r, "2 of 4 checks failed", code=1)
    assert "checked 4, passed 2, failed 2, skipped 0" in r.output and "failed 2x: relative error" in r.output


def test_check_with_nothing_checked_is_not_a_pass(registry, fake_gate, monkeypatch):
    monkeypatch.setattr(registry["fake-f16"], "unsupported", lambda prob: "fake: no block patterns")
    r = check("--impl", "fake-f16", "--pattern", "block_diagonal", "--T", 7, "--T", 128)
    one_error(r, "nothing was checked", "all 3 cases were skipped", code=1)
    assert "checked 0, passed 0, failed 0, skipped 3" in r.output and "skipped 3x: fake: no block patterns" in r.output


def test_check_refuses_an_implementation_that_cannot_run_here(registry, fake_gate):
    one_error(check("--impl", "fake-absent"), "impl=fake-absent cannot run here", "not installed")


@pytest.mark.parametrize("opt", ["--T", "--D", "--B", "--H"])
def test_check_refuses_zero_sizes_first(registry, opt, monkeypatch):
    monkeypatch.setattr(check_mod, "gate", lambda *a, **k: pytest.fail("ran"))
    one_error(check("--impl", "fake-absent", opt, 0), f"{opt}=0 must be a positive integer")


def test_sweep_of_skipped_rows_only_is_not_a_pass(tmp_path, device):
    r = sweep(*SWEEP, "--impl", "fake-absent", "--out", tmp_path / "r.csv")
    one_error(r, "nothing was checked", "all 6 new rows were skipped", code=1)
    assert "skipped 6x: fake: needs a library" in r.stderr
    assert sweep(*SWEEP, "--impl", "fake-absent", "--out", tmp_path / "r.csv", "--resume").exit_code == 0


# -- no traceback --------------------------------------------------------------------------------

def csv_with(tmp_path, name, **change):
    df = pd.read_csv(SMALL, dtype=str, keep_default_na=False)
    for col, (row, value) in change.items():
        df.loc[row, col] = value
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


@pytest.fixture
def paths(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "bin.md").write_bytes(b"# \xd0\xff\x00binary")
    (tmp_path / "cut.csv").write_bytes(SMALL.read_bytes()[:20300])
    (tmp_path / "a.csv").write_bytes(SMALL.read_bytes())
    csv_with(tmp_path, "nonnum.csv", median_ms=(3, "abc"))
    pd.read_csv(SMALL).drop(columns=["median_ms"]).to_csv(tmp_path / "nocol.csv", index=False)
    return tmp_path


@pytest.mark.parametrize("args, words", [
    (["sweep", "--out", "{t}/file/x.csv"], ["file/x.csv", "not a directory"]),
    (["sweep", "--out", "{t}/dir"], ["'{t}/dir' is a directory"]),
    (["sweep", "--out", "/dev/full", "--overwrite"], ["/dev/full is not a regular file"]),
    (["sweep", "--out", "/proc/attnbench-x.csv"], ["/proc/attnbench-x.csv cannot be written"]),
    (["sweep", "--out", "{t}/a.csv"], ["a.csv exists", "--resume"]),
    (["sweep", "--out", "{t}/bin.md", "--resume"], ["bin.md is not a results CSV", "UTF-8"]),
    (["sweep", "--resume", "--overwrite"], ["--resume and --overwrite"]),
    (["sweep", "--bogus"], ["No such option", "--bogus", "--help"]),
    (["plot", "{t}/a.csv", "--out-dir", "{t}/file/x"], ["--out-dir", "file/x", "Not a directory"]),
    (["plot", "{t}/a.csv", "--out-dir", "{t}/file"], ["'{t}/file' is a file"]),
    (["plot", "{t}/nonnum.csv"], ["nonnum.csv line 5", "column median_ms", "'abc'", "not a number"]),
    (["plot", "{t}/nocol.csv"], ["missing columns median_ms"]),
    (["plot", "{t}/cut.csv"], ["cut.csv line", "cut short"]),
    (["plot", "{t}/dir"], ["{t}/dir is a directory"]),
    (["plot", "{t}/bin.md"], ["bin.md is not a results CSV"]),
    (["readme", "{t}/a.csv", "--readme", "{t}/bin.md"], ["README {t}/bin.md is not UTF-8 text"]),
    (["readme", "{t}/a.csv", "--readme", "{t}/dir"], ["'{t}/dir' is a directory"]),
    (["readme", "{t}/a.csv", "--readme", "/dev/full"], ["README /dev/full is not a regular file"]),
    (["readme", "{t}/a.csv", "--readme", "{t}/nope.md"], ["README {t}/nope.md does not exist"]),
    (["check", "--T", "0"], ["--T=0"]),
    (["check", "--D", "0"], ["--D=0"]),
    (["check", "--B", "0"], ["--B=0"]),
])
def test_every_refusal_is_one_error_line_and_exit_2(paths, no_gpu, args, words):
    t = str(paths)
    r = CliRunner().invoke(main, [a.replace("{t}", t) for a in args])
    one_error(r, *(w.replace("{t}", t) for w in words))
    assert not list(paths.glob(".*")) and not list(Path("/tmp").glob(".attnbench-x.csv.*"))


def test_check_refuses_naive_without_a_device(monkeypatch):
    monkeypatch.setattr(impls_mod, "device_problem", lambda: "no CUDA device (test)")
    one_error(check("--impl", "naive"), "impl=naive cannot run here: no CUDA device (test)")


def test_integer_columns_read_as_floats_do_not_reach_file_names(tmp_path):
    df = pd.read_csv(SMALL)
    df[["B", "H", "D"]] = df[["B", "H", "D"]].astype(float)
    df.to_csv(tmp_path / "f.csv", index=False)
    assert ",16.0," in (tmp_path / "f.csv").read_text()
    r = CliRunner().invoke(main, ["plot", str(tmp_path / "f.csv"), "--out-dir", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (tmp_path / "p").iterdir())
    assert "f_float32_D16_B1_H2_runtime.png" in names and not any(".0_" in n for n in names)
    assert read_results(tmp_path / "f.csv")["D"].dtype == "int64"


@pytest.mark.parametrize("args, words", [
    (["run", "--impl", "fake-absent", "--pattern", "bigbird", "--T", "1000000000000"],
     ["T=1000000000000 exceeds 268435456"]),
    (["check", "--impl", "fake-absent", "--T", "1000000000000"], ["T=1000000000000 exceeds"]),
    (["run", "--pattern", "bigbird", "--T", "16777216", "--impl", "fake-absent"], ["block mask", "262144 x 262144"]),
    (["run", "--impl", "fake-f16", "--dtype", "float16", "--D", "16", "--pattern", "bigbird", "--T", "100"],
     ["T=100 is not a multiple of block=64"]),
])
def test_bad_input_is_reported_as_such_on_a_machine_without_a_gpu(registry, args, words):
    """Input first, device second: the same refusal a GPU machine gives, no MemoryError."""
    r = CliRunner().invoke(main, args)
    one_error(r, *words)


def test_an_implementation_s_own_limits_come_before_the_machine(monkeypatch):
    from attnbench.impls import Problem, get_impl
    from attnbench.patterns import make_mask

    impl = get_impl("fast-tc")
    monkeypatch.setattr(type(impl), "availability", lambda self: "no CUDA device (test)")
    with pytest.raises(BadInput, match="D=100 is not supported by fast-tc"):
        impl.require(Problem(make_mask("dense", 64), 1, 1, 100, "bfloat16"))


@pytest.mark.parametrize("args, words", [
    (["sweep", "--config", "decode", "--H", "8", "--H", "16"], ["--H given twice", "--H 8"]),
    (["sweep", "--H-kv=2", "--H-kv", "4"], ["--H-kv given twice", "--H-kv=2"]),
    (["run", "--T", "64", "--T=128"], ["--T given twice", "--T 64"]),
    (["check", "--impl", "naive", "--B", "1", "--B", "2"], ["--B given twice"]),
    (["sweep", "--out", "a.csv", "--out", "b.csv"], ["--out given twice"]),
])
def test_a_single_valued_option_given_twice_is_refused_by_name(args, words, monkeypatch):
    """click keeps the last of two silently; attnbench refuses before any device, naming the option."""
    def no_device(*a, **k):
        raise AssertionError("a device was asked for")
    monkeypatch.setattr(sw, "device_context", no_device)
    one_error(CliRunner().invoke(main, args), *words)


def test_repeatable_options_and_a_value_that_looks_like_an_option_still_pass_the_parse():
    r = CliRunner().invoke(main, ["sweep", "--T", "64", "--T", "128", "--D", "16", "--D", "32", "--B", "1", "--B", "2",
                                  "--H", "4", "--pattern", "custom", "--expr", "--H", "--help"])
    assert r.exit_code == 0 and "given twice" not in r.output, r.output
