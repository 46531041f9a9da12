"""The CLI: listing, compiling, and bad input refused before any launch."""
import pytest
from click.testing import CliRunner

from attnbench import compile as kc
from attnbench.cli import main
from attnbench.patterns import PATTERNS


@pytest.fixture
def no_launch(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel was loaded for input that should have been refused")
    monkeypatch.setattr(kc, "get_module", boom)


def test_list_shows_patterns_and_implementations():
    r = CliRunner().invoke(main, ["list"])
    assert r.exit_code == 0
    for name in PATTERNS:
        assert name in r.output
    assert "naive" in r.output and "window=64" in r.output and "sink=16" in r.output


@pytest.mark.parametrize("args, words", [
    (["run", "--pattern", "streaming", "--T", "5000", "--max-t", "4096"], ["T=5000", "max_t=4096"]),
    (["run", "--pattern", "block_diagonal", "--T", "100"], ["T=100", "block=16"]),
    (["run", "--pattern", "window", "--window", "0"], ["window=0"]),
    (["run", "--pattern", "streaming", "--T", "64", "--sink", "65"], ["sink=65", "T=64"]),
    (["run", "--pattern", "window", "--dilation", "2"], ["dilation"]),
    (["run", "--pattern", "streaming", "--T", "2048", "--max-keys", "32"], ["max_keys=32", "80"]),
    (["run", "--dtype", "bfloat16"], ["dtype=bfloat16", "naive"]),
    (["run", "--impl", "nope"], ["'--impl': 'nope' is not one of", "'naive'"]),
    (["run", "--D", "0"], ["D=0"]),
    # the backward passes: a dtype or a pass the implementation does not compute, a serving shape
    (["run", "--pass", "bwd", "--impl", "sdpa-flash", "--dtype", "float32", "--D", "64"],
     ["dtype=float32 is not supported by sdpa-flash"]),
    (["run", "--pass", "bwd", "--impl", "fast-f32", "--dtype", "float32", "--D", "64"],
     ["pass=bwd is not supported by fast-f32 (supports: fwd)"]),
    (["run", "--pass", "fwd+bwd", "--impl", "cublas", "--dtype", "bfloat16", "--D", "64", "--H", "4", "--H-kv", "2"],
     ["pass=fwd+bwd takes prefill shapes only", "H_kv=2 < H=4", "forward-only"]),
    (["check", "--pass", "bwd", "--impl", "cublas", "--H", "4", "--Tq", "1"],
     ["pass=bwd takes prefill shapes only", "Tq=1 < Tk=4096"]),
])
def test_bad_input_is_refused_by_name_before_any_launch(args, words, no_launch, monkeypatch):
    # pretend a device is there, so refusal comes from the input, not the machine
    from attnbench import impls
    monkeypatch.setattr(impls.Impl, "availability", lambda self: None)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and "Traceback" not in r.output
    for w in words:
        assert w in r.output


def test_naive_refuses_sizes_past_its_local_memory_limit(no_launch, monkeypatch):
    from attnbench import impls
    monkeypatch.setattr(impls.Impl, "availability", lambda self: None)
    r = CliRunner().invoke(main, ["run", "--pattern", "dense", "--T", "32768"])
    assert r.exit_code == 2 and "max_t=32768" in r.output and "16384" in r.output


def test_compile_reports_every_kernel():
    from attnbench import compile as kc

    r = CliRunner().invoke(main, ["compile", "--arch", "sm_80"])
    assert r.exit_code == 0, r.output
    assert "naive_dense" in r.output and "naive_sparse" in r.output and "C=384" in r.output
    lines = {}
    for line in r.stdout.splitlines()[1:]:
        lines.setdefault(line.split()[1], []).append(line)
    expected = [(name, " ".join(f"{k}={v}" for k, v in sorted(d.items()))) for name, d in kc.standard_builds()
                if kc.target_arch(d, "sm_80") == "sm_80" and not kc.unbuildable(name, "sm_80")]
    assert len(expected) > 100
    missing = [(name, c) for name, c in expected if not any(f" {c} " in f"{x} " for x in lines.get(name, ()))]
    assert missing == [], f"{len(missing)} of {len(expected)} builds not reported"


def test_compile_rejects_a_bad_arch():
    r = CliRunner().invoke(main, ["compile", "--arch", "ampere"])
    assert r.exit_code == 2 and "arch='ampere'" in r.output


def test_compile_refuses_by_name_the_families_an_arch_cannot_build(monkeypatch):
    from attnbench import compile as kc

    monkeypatch.setattr(kc, "standard_builds", lambda: [("tiles", {}), ("fast_f32", {"C": 64})])
    r = CliRunner().invoke(main, ["compile", "--arch", "sm_75"])
    assert r.exit_code == 0, r.output
    assert "skipped: fast_f32 is not built for sm_75: cp.async needs sm_80 or newer" in r.stderr
    assert "expand_tiles" in r.stdout and "ptxas" not in r.output


@pytest.mark.parametrize("command", ["run", "check", "sweep", "plot", "readme", "compile"])
def test_every_help_shows_the_defaults(command):
    r = CliRunner().invoke(main, [command, "--help"])
    assert r.exit_code == 0 and "[default: " in r.output, r.output


def test_every_option_the_readme_names_exists():
    """An option named in the README's prose or tables (`--name`) is an option of some command."""
    import re
    from pathlib import Path

    import click

    names = set()
    for cmd in main.commands.values():
        for p in cmd.params:
            if isinstance(p, click.Option):
                names.update(o for o in p.opts + p.secondary_opts if o.startswith("--"))
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    text = re.sub(r"\bncu [^`]*?(?=attnbench)", "", text)  # Nsight Compute's own options, before the command it runs
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    assert named and sorted(named - names) == []
