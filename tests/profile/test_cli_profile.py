"""`trainbridge profile DIR` on Ascend profiler folders that already exist (tests/fixtures/ascend/).

The command reads a torch_npu *_ascend_pt folder (or its ASCEND_PROFILER_OUTPUT, or a parent of
one or more of them) and prints verdict, breakdown, findings and suggestions; bad input is one
line and exit code 2. The fixtures' expected verdicts are worked out in test_ascend_profile.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainbridge import cli
from trainbridge.profile import ascend as A

from tests.kits.paths import FIXTURES

FIX = FIXTURES / "ascend"


def inner(name: str) -> Path:
    (pt,) = (FIX / name).glob("*_ascend_pt")
    return pt


@pytest.fixture()
def invoke(monkeypatch):
    # a wide console, so that rich does not wrap the lines the assertions read
    monkeypatch.setattr(cli.console, "width", 200)
    monkeypatch.setattr(cli.err_console, "width", 200)

    def run(*args):
        return CliRunner().invoke(cli.app, ["profile", *map(str, args)])

    return run


def verdict_of(output: str) -> str:
    m = re.search(r"verdict\s*│\s*([\w-]+)", output)
    assert m, output
    return m.group(1)


@pytest.mark.parametrize(("name", "verdict"), [("host_bound", "host-bound"), ("compute_bound", "compute-bound"),
                                               ("comm_heavy", "communication-bound"), ("aicpu_mte2", "memory-bound")])
def test_a_good_folder_names_its_verdict(invoke, name, verdict):
    out = invoke(inner(name))
    assert out.exit_code == 0, out.output
    assert verdict_of(out.output) == verdict
    assert "Traceback" not in out.output


def test_the_report_shows_breakdown_ranked_findings_and_suggestions(invoke):
    out = invoke(inner("host_bound") / "ASCEND_PROFILER_OUTPUT")
    assert out.exit_code == 0, out.output
    text = out.output
    assert re.search(r"free \(device idle\)\s*│\s*3\.50 ms \(35\.0%\)", text), text
    assert re.search(r"computing\s*│\s*6\.00 ms \(60\.0%\)", text), text
    assert "findings (9):" in text
    severities = re.findall(r"^  (HIGH|MEDIUM|LOW|INFO) ", text, re.MULTILINE)
    assert severities[:2] == ["HIGH", "HIGH"] and set(severities[2:]) == {"MEDIUM"}  # most severe first
    assert "affinity.rms_norm" in text and "model.py:41" in text
    assert "TASK_QUEUE_ENABLE (env:TASK_QUEUE_ENABLE): for free_time" in text
    assert "NpuFusedAdamW (torch_npu.optim.NpuFusedAdamW): for affinity.optimizer" in text


def test_top_limits_the_findings_printed(invoke):
    out = invoke(inner("host_bound"), "--top", "2")
    assert out.exit_code == 0, out.output
    assert len(re.findall(r"^  (HIGH|MEDIUM|LOW|INFO) ", out.output, re.MULTILINE)) == 2
    assert "and 7 more" in out.output


def test_json_writes_a_report_that_parses_back(invoke, tmp_path):
    dest = tmp_path / "sub" / "report.json"
    out = invoke(inner("compute_bound"), "--json", dest)
    assert out.exit_code == 0, out.output
    assert f"wrote {dest}" in out.output
    report = A.AscendProfileReport.model_validate_json(dest.read_text())
    assert report == A.analyse_ascend(inner("compute_bound"))
    assert report.verdict == "compute-bound" and report.kernel_time.cube_share == pytest.approx(0.75)
    assert {f.rule for f in report.findings} >= {"bound.cube", "matmul_alignment"}


def test_the_parent_of_a_fixture_folder_is_found(invoke):
    out = invoke(FIX / "comm_heavy")  # holds worker1_..._ascend_pt
    assert out.exit_code == 0, out.output
    assert verdict_of(out.output) == "communication-bound"
    assert "worker1_9001_20250303120000777_ascend_pt" in out.output


def test_a_parent_of_several_ranks_analyses_each_and_says_which(invoke, tmp_path):
    for name in ("host_bound", "comm_heavy"):
        shutil.copytree(inner(name), tmp_path / "result" / inner(name).name)
    dest = tmp_path / "all.json"
    out = invoke(tmp_path / "result", "--json", dest)
    assert out.exit_code == 0, out.output
    text = out.output
    assert "rank 1/2: localhost_4021_20250301083015123_ascend_pt" in text
    assert "rank 2/2: worker1_9001_20250303120000777_ascend_pt" in text
    assert re.findall(r"verdict\s*│\s*([\w-]+)", text) == ["host-bound", "communication-bound"]
    assert "2 rank folders:" in text
    reports = [A.AscendProfileReport.model_validate(r) for r in json.loads(dest.read_text())]
    assert [r.verdict for r in reports] == ["host-bound", "communication-bound"]


def test_an_unreadable_rank_is_reported_and_the_others_analysed(invoke, tmp_path):
    shutil.copytree(inner("compute_bound"), tmp_path / inner("compute_bound").name)
    (tmp_path / "a_1_2_ascend_pt" / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)  # sorts first, holds nothing
    out = invoke(tmp_path)
    assert out.exit_code == 0, out.output
    assert "warning: a_1_2_ascend_pt: not analysed" in out.stderr
    assert "a_1_2_ascend_pt: not analysed" in out.stdout  # in the rank summary
    assert re.findall(r"verdict\s*│\s*([\w-]+)", out.stdout) == ["compute-bound"]


def test_malformed_files_are_warnings_and_the_rest_is_analysed(invoke):
    out = invoke(inner("malformed"))
    assert out.exit_code == 0, out.output
    assert verdict_of(out.output) == "host-bound"
    for w in ("op_statistic.csv: lacks required columns ['Count']", "operator_details.csv: empty file",
              "trace_view.json: not valid JSON", "step_trace_time.csv: skipped 2 malformed row(s)"):
        assert f"warning: {w}" in out.output


def test_a_binary_csv_is_a_warning_not_a_traceback(invoke, tmp_path):
    folder = tmp_path / "x_1_2_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    shutil.copytree(inner("compute_bound") / "ASCEND_PROFILER_OUTPUT", folder)
    (folder / "kernel_details.csv").write_bytes(b"Name,Type\x00\n\xff\xfe\x00 binary\n")
    out = invoke(folder.parent)
    assert out.exit_code == 0, out.output
    assert "warning: kernel_details.csv: not readable as a UTF-8 CSV" in out.output
    assert verdict_of(out.output) == "unknown"  # no kernels: cube vs vector cannot be told


def one_line_error(out) -> str:
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.output
    return lines[0]


def test_a_missing_path_is_one_line_and_exit_2(invoke, tmp_path):
    line = one_line_error(invoke(tmp_path / "absent"))
    assert f"{tmp_path / 'absent'}: no such folder" in line


def test_a_folder_without_profiler_output_is_one_line_and_exit_2(invoke, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    line = one_line_error(invoke(tmp_path))
    assert "no torch_npu profiler output found" in line and "no trainbridge.toml" in line


def test_a_grandparent_points_at_the_folders_below(invoke):
    line = one_line_error(invoke(FIX))
    assert "found deeper: aicpu_mte2/localhost_3100_20250304090000555_ascend_pt" in line


def test_an_empty_output_folder_is_one_line_and_exit_2(invoke, tmp_path):
    (tmp_path / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    line = one_line_error(invoke(tmp_path / "x_ascend_pt"))
    assert "none of step_trace_time.csv" in line


def _op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def _two_step_trace():
    """Two 10 ms steps; in each, aten::linear (6 ms) holds aten::addmm (5 ms), then aten::relu (1 ms)."""
    events = []
    for k, t0 in ((1, 0), (2, 10_000)):
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "ts": t0, "dur": 10_000,
                    "pid": 7, "tid": 1},
                   _op("aten::linear", t0 + 100, 6000), _op("aten::addmm", t0 + 200, 5000),
                   _op("aten::relu", t0 + 7000, 1000)]
    return {"traceEvents": events + [{"ph": "M", "name": "process_name"}, {"ph": "X", "name": "bad"}]}


@pytest.mark.parametrize("give_file", [False, True])
def test_a_pytorch_trace_gets_the_report_a_live_profile_prints(invoke, tmp_path, give_file):
    trace = tmp_path / "host_4242.1741200000000.pt.trace.json"
    trace.write_text(json.dumps(_two_step_trace()))
    r = invoke(trace if give_file else tmp_path, "--json", tmp_path / "out" / "report.json")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["step"]["n"] == 2 and report["step"]["median_ms"] == pytest.approx(10.0)
    ops = {o["name"]: o for o in report["all_ops"]}
    assert ops["aten::addmm"]["self_ms_per_step"] == pytest.approx(5.0)
    assert ops["aten::linear"]["self_ms_per_step"] == pytest.approx(1.0)  # 6 ms less the addmm inside it
    assert ops["aten::relu"]["calls_per_step"] == pytest.approx(1.0)
    assert report["op_self_ms_per_step"] == pytest.approx(7.0) and report["verdict"] == "host-bound"


def test_a_real_torch_profiler_trace_is_read(invoke, tmp_path):
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3),
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(4):
            torch.relu(torch.randn(128, 128) @ torch.randn(128, 128))
            prof.step()
    r = invoke(tmp_path, "--json", tmp_path / "report.json")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["step"]["n"] == 3 and any(o["name"] == "aten::mm" for o in report["all_ops"])
    assert "aten::mm" in r.output


def test_a_trace_without_operators_is_one_line_and_exit_2(invoke, tmp_path):
    trace = tmp_path / "host_4242.1741200000000.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 0, "dur": 5}]}))
    line = one_line_error(invoke(tmp_path))
    assert "no operator (cpu_op) events" in line
    trace.write_text("{not json")
    assert "not a readable JSON trace" in one_line_error(invoke(trace))


def test_options_of_the_other_mode_are_refused(invoke, tmp_path):
    line = one_line_error(invoke(inner("compute_bound"), "--out", tmp_path / "o"))
    assert "not a workload" in line and "--json FILE" in line
    line = one_line_error(invoke(inner("compute_bound"), "--json", tmp_path))
    assert "is a folder" in line


def test_a_workload_folder_still_goes_to_the_workload_profile(invoke, tmp_path):
    (tmp_path / "trainbridge.toml").write_text("this is [not toml")
    line = one_line_error(invoke(tmp_path))
    assert "not valid TOML" in line  # the manifest was read: the workload branch ran, nothing else
    line = one_line_error(invoke(tmp_path, "--json", tmp_path / "r.json"))
    assert "--json and --advisor are for analysing a profiler folder" in line
    line = one_line_error(invoke(tmp_path, "--advisor", tmp_path / "adv"))
    assert "--json and --advisor are for analysing a profiler folder" in line and not (tmp_path / "adv").exists()
