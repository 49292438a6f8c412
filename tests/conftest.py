"""Test-wide settings.

TRAINBRIDGE_FAST_BF16=1: recipes that depend on whether the CPU has bf16 math units
(targets/capabilities.py) plan the same way on every CI machine. Tests of the other
branch set it to 0 themselves (monkeypatch), and subprocesses inherit either.

Shared code lives in tests/kits/ (imported as `tests.kits...`); its asserts are rewritten
like the tests' own, so a failing helper shows its values.
"""

import os

import pytest

os.environ.setdefault("TRAINBRIDGE_FAST_BF16", "1")

pytest.register_assert_rewrite("tests.kits")
