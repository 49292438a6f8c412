"""Each target's profiler: torch.profiler's trace where TensorBoard and HTA look (cpu), and on
npu torch_npu's own profiler configured as Ascend's tuning guide shows, whose folder the run
keeps and the Ascend analysis reads."""

import importlib.machinery
import sys
import types

import pytest

from trainbridge.profile.analysis import _ascend_report
from trainbridge.targets.npu import NpuTarget

from tests.kits.paths import FIXTURES


def _fake_torch_npu_profiler():
    """torch_npu.profiler's documented surface, recording how it was called."""
    calls = {}
    P = types.SimpleNamespace(
        ProfilerActivity=types.SimpleNamespace(CPU="CPU", NPU="NPU"),
        ExportType=types.SimpleNamespace(Text="Text", Db="Db"),
        ProfilerLevel=types.SimpleNamespace(Level0="Level0", Level1="Level1", Level2="Level2"),
        AiCMetrics=types.SimpleNamespace(AiCoreNone="AiCoreNone", PipeUtilization="PipeUtilization"),
        _ExperimentalConfig=lambda **kw: ("config", kw),
        tensorboard_trace_handler=lambda d: ("handler", d),
        profile=lambda **kw: calls.setdefault("profile", kw),
    )
    mod = types.ModuleType("torch_npu")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    mod.profiler = P
    return mod, calls


def test_the_npu_profiler_is_torch_npus_own_at_level_1_with_a_trace_handler(monkeypatch, tmp_path):
    mod, calls = _fake_torch_npu_profiler()
    monkeypatch.setitem(sys.modules, "torch_npu", mod)
    NpuTarget().profiler(str(tmp_path / "prof"))
    kw = calls["profile"]
    assert kw["activities"] == ["CPU", "NPU"]
    assert kw["on_trace_ready"] == ("handler", str(tmp_path / "prof"))
    tag, config = kw["experimental_config"]
    assert config["profiler_level"] == "Level1" and config["aic_metrics"] == "PipeUtilization"
    assert config["export_type"] == ["Text"]  # the csv/json files msprof-analyze and our loader read


def test_an_npu_runs_profiler_folder_is_analysed_like_trainbridge_profile_dir(tmp_path):
    evidence = []
    report = _ascend_report(str(FIXTURES / "ascend" / "host_bound"), evidence)
    assert report is not None and report["verdict"] == "host-bound", evidence
    assert any(e.startswith("Ascend profile: host-bound") for e in evidence)
    assert _ascend_report(None, evidence := []) is None and "did not run" in evidence[0]
    assert _ascend_report(str(tmp_path), evidence := []) is None and "could not be analysed" in evidence[0]


@pytest.mark.parametrize("target", ["cpu"])
def test_the_cpu_profiler_writes_a_tensorboard_trace(target, tmp_path):
    import torch

    from trainbridge.targets import get_target

    prof = get_target(target).profiler(str(tmp_path / "prof"))
    prof.start()
    torch.randn(64, 64) @ torch.randn(64, 64)
    prof.stop()
    traces = list((tmp_path / "prof").glob("*.pt.trace.json"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert any(e.key == "aten::mm" for e in prof.key_averages())
