"""targets/capabilities.py: whether a target has bf16 math units (read by fp32_where_bf16_slow
and autocast_reapply; tests/conftest.py pins TRAINBRIDGE_FAST_BF16=1 for the rest of the suite)."""

from trainbridge.targets import capabilities


def test_capability_reads_cpu_flags(monkeypatch):
    monkeypatch.delenv("TRAINBRIDGE_FAST_BF16", raising=False)
    monkeypatch.setattr(capabilities, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert capabilities.fast_bf16("cpu") is False
    monkeypatch.setattr(capabilities, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert capabilities.fast_bf16("cpu") is True
    assert capabilities.fast_bf16("cuda") is True
