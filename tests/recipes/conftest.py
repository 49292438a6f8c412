"""Fixtures for the recipe tests. Their plain helpers (load/compare programs, `applied`, the
torch_npu stand-in, `needs_nanogpt`) are in tests/kits/recipe_testkit.py, imported as `kit`."""

import pytest


@pytest.fixture
def slow_bf16(monkeypatch):
    """A target without bf16 math units (tests/conftest.py pins TRAINBRIDGE_FAST_BF16=1 otherwise)."""
    monkeypatch.setenv("TRAINBRIDGE_FAST_BF16", "0")
