"""Test-wide settings.

TRAINBRIDGE_FAST_BF16=1: recipes that depend on whether the CPU has bf16 math units
(targets/capabilities.py) plan the same way on every CI machine. Tests of the other
branch set it to 0 themselves (monkeypatch), and subprocesses inherit either.
"""

import os

os.environ.setdefault("TRAINBRIDGE_FAST_BF16", "1")
