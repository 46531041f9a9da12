"""The host scripts of scripts/ (not a package) loaded as modules for their tests."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[2]


def script(name: str):
    """scripts/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
