"""The shape of the code: no import cycle among attnbench's modules (top-level imports), none among
the kernels' headers, and every kernel header reachable from a kernel."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph: dict) -> list:
    found, state = [], {}

    def visit(n, path):
        state[n] = 1
        for d in graph.get(n, ()):
            if state.get(d) == 1:
                found.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n, [n])
    return found


def test_no_import_cycle_in_the_package():
    graph = {}
    for p in (ROOT / "attnbench").rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        pkg = parts[:-1]
        deps = set()
        for node in ast.parse(p.read_text()).body:  # what importing the module imports
            if isinstance(node, ast.ImportFrom) and node.level:
                base = list(pkg[:len(pkg) - (node.level - 1)])
                if node.module:
                    deps.add(".".join(base + [node.module]))
                else:  # from . import x: the module x (or the package, for a name it defines)
                    deps.update(".".join(base + [a.name]) for a in node.names)
        graph[name] = deps
    assert "attnbench.errors" in graph and graph["attnbench.errors"] == set()  # the leaf
    assert "attnbench.compile" in graph["attnbench.naive"]  # `from . import compile as kc` counted
    assert _cycles(graph) == []


def test_no_include_cycle_in_the_kernels():
    kdir = ROOT / "kernels"
    inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
    graph = {str(p.relative_to(kdir)): set(inc.findall(p.read_text())) - {"pattern.cuh"}
             for p in list(kdir.rglob("*.cuh")) + list(kdir.glob("*.cu"))}
    assert "tc/softmax.cuh" in graph["fast_tc.cu"] and "common.cuh" in graph["patterns/window.cuh"]
    assert _cycles(graph) == []
    used = set().union(*graph.values())
    headers = {h for h in graph if h.endswith(".cuh")}
    patterns = {h for h in headers if h.startswith("patterns/")}  # included by name (compile.py)
    assert headers - patterns - used == set(), "a header no kernel includes"


def test_every_package_directory_is_installed():
    """A wheel holds only the packages pyproject.toml lists: each directory of attnbench/ with an __init__.py (and
    kernels/ with its subdirectories, installed as attnbench.kernels) must be named there."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'"([\w.]+)"', re.search(r"^packages\s*=\s*\[([^\]]*)\]", text, re.M).group(1)))
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "attnbench").rglob("__init__.py")}
    found |= {"attnbench." + ".".join(d.relative_to(ROOT).parts) for d in [ROOT / "kernels", *(ROOT / "kernels").iterdir()]
              if d.is_dir() and any(d.glob("*.cu*"))}
    assert {"attnbench", "attnbench.peers", "attnbench.kernels.tc"} <= found
    assert found - listed == set(), "a package pyproject.toml does not list"
