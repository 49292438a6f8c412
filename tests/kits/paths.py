"""Where things are, for tests in any folder: use these instead of `Path(__file__).parent / ...`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]  # the repository root
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
WORKLOADS = ROOT / "workloads"


def import_fixture(relpath: str) -> ModuleType:
    """Import a program under tests/fixtures/ (e.g. "evidence/tiny_gpt.py") as a top-level module
    named after its file, as if its folder were on sys.path, without putting it there."""
    path = FIXTURES / relpath
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod
