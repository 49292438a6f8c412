"""The Ascend fixture folders are in the formats msprof-analyze reads, and it agrees with our verdicts.

tests/fixtures/ascend/ holds hand-written torch_npu profiler folders whose numbers are ours but
whose file names, columns and JSON shapes follow what msprof-analyze 26.2.0 parses (docs/npu.md,
"msprof-analyze against our fixture folders"). Part (a) always runs: our loader reads every
folder and gives the verdict the folder was built to show. Part (b) runs the real advisor
(`msprof-analyze advisor all`) on a copy of each folder when it can be found, either through
TRAINBRIDGE_MSPROF_ANALYZE (the path of the msprof-analyze executable, e.g. in a separate
virtualenv) or as an importable `msprof_analyze` package, and checks that it accepts the folder
and that its findings agree with ours wherever it has a matching check:

    TRAINBRIDGE_MSPROF_ANALYZE=/path/to/venv/bin/msprof-analyze python -m pytest tests/profile/test_ascend_real_formats.py
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kits.paths import FIXTURES
from trainbridge.profile import ascend as A
from trainbridge.profile.ascend.advisor import ENV, advisor_command, overall_of, read_xlsx, run_advisor

FIX = FIXTURES / "ascend"

# folder -> the verdict it was built to show (multi_rank: one per rank, in folder-name order)
BUILT_FOR = {
    "host_bound": "host-bound",
    "compute_bound": "compute-bound",
    "aicpu_mte2": "memory-bound",
    "comm_heavy": "communication-bound",
    "partial": "host-bound",
    "malformed": "host-bound",
}
MULTI_RANK = ["communication-bound", "compute-bound"]  # rank 0 waits in the all-reduce for slow rank 1
ALL = [*BUILT_FOR, "multi_rank"]
TOOL_COLUMNS = {"OP State", "Task ID", "Block Dim", "Input Shapes", "Output Shapes", "aic_mac_ratio",
                "aic_mte2_ratio", "aic_fixpipe_ratio", "aiv_vec_ratio", "aiv_mte2_ratio", "aiv_mte3_ratio",
                "aiv_vec_time(us)", "aic_mac_time(us)"}


def pt_dirs(name: str) -> list[Path]:
    return sorted((FIX / name).glob("*_ascend_pt"))


# --- (a) always: our loader on the tool's formats --------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_every_folder_is_in_the_tool_layout(name):
    for pt in pt_dirs(name):
        infos = sorted(pt.glob("profiler_info_*.json"))
        assert len(infos) == 1, pt  # the tool finds a rank through profiler_info_{rank}.json
        rank = int(re.fullmatch(r"profiler_info_(\d+)\.json", infos[0].name).group(1))
        assert json.loads(infos[0].read_text())["rank_id"] == rank
        out = pt / A.OUTPUT_DIR
        with (out / "kernel_details.csv").open(encoding="utf-8", newline="") as f:
            header = next(csv.reader(f))
        assert TOOL_COLUMNS <= set(header), TOOL_COLUMNS - set(header)
        assert "Block Num" not in header
        trace = out / "trace_view.json"
        if trace.is_file() and name != "malformed":
            events = json.loads(trace.read_text())
            assert isinstance(events, list)  # a top-level array, as the tool streams it (ijson "item")
            procs = {e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
            assert {"Overlap Analysis", "Ascend Hardware"} <= procs, procs


@pytest.mark.parametrize("name", list(BUILT_FOR))
def test_our_loader_gives_the_built_for_verdict(name):
    r = A.analyse_ascend(FIX / name)
    assert r.verdict == BUILT_FOR[name], r.evidence


def test_the_built_for_findings():
    hb = A.analyse_ascend(FIX / "host_bound")
    assert hb.breakdown.free_share > A.HOST_BOUND_FREE_SHARE
    assert {f.suggestion for f in hb.findings if f.rule.startswith("affinity.")} == {
        "npu_rms_norm", "npu_rotary_mul", "npu_fusion_attention", "npu_swiglu", "npu_confusion_transpose",
        "NpuFusedAdamW"}
    cb = A.analyse_ascend(FIX / "compute_bound")
    assert cb.kernel_time.cube_share >= A.SHARE_THRESHOLD and cb.by_rule("bound.cube")
    ac = A.analyse_ascend(FIX / "aicpu_mte2")
    assert [f.ops for f in ac.by_rule("aicpu")] == [["IndexPut"]]
    assert [f.ops[0] for f in ac.by_rule("bound.memory")] == ["Add", "Mul"]
    assert all(f.value > A.BOUND_RATIO for f in ac.by_rule("bound.memory"))
    ch = A.analyse_ascend(FIX / "comm_heavy")
    assert ch.breakdown.communication_share > A.COMM_BOUND_SHARE
    pa = A.analyse_ascend(FIX / "partial")
    assert pa.files_present == ["kernel_details.csv"] and pa.breakdown.source == "kernel_details.csv"
    ma = A.analyse_ascend(FIX / "malformed")
    assert any(w.startswith("trace_view.json: not valid JSON") for w in ma.warnings)
    assert ma.skipped_rows == {"step_trace_time.csv": 2, "kernel_details.csv": 2} and ma.breakdown is not None


def test_multi_rank_each_rank_and_the_slow_one():
    ranks = A.analyse_ranks(FIX / "multi_rank")
    assert [d.parent.name for d, _ in ranks] == [p.name for p in pt_dirs("multi_rank")]
    reports = [r for _, r in ranks]
    assert all(isinstance(r, A.AscendProfileReport) for r in reports)
    assert [r.verdict for r in reports] == MULTI_RANK
    comp = [r.breakdown.computing_us for r in reports]
    assert comp.index(max(comp)) == 1 and max(comp) - min(comp) == 2500.0
    assert [r.breakdown.step_us for r in reports] == [10000.0, 10000.0]  # synchronous steps: rank 0 waits


# --- (b) the real advisor, when it can be found ----------------------------------------------------

CMD = advisor_command()
needs_advisor = pytest.mark.skipif(
    CMD is None, reason=f"msprof-analyze not found: set {ENV} to the msprof-analyze executable (e.g. installed in a "
                        "separate virtualenv: pip install msprof-analyze) or install the msprof_analyze package")


class AdvisorRun:
    """The product's run of the advisor (profile/ascend/advisor.py), with its workbook's sheets."""

    def __init__(self, rep):
        self.report = rep
        self.rc, self.out = rep.returncode, Path(rep.out_dir)
        self.log = (self.out / "advisor.log").read_text() if (self.out / "advisor.log").exists() else rep.note
        self.html = rep.html
        self.xlsx = [rep.xlsx] if rep.xlsx else []
        self.sheets = read_xlsx(Path(rep.xlsx)) if rep.xlsx else {}

    def problems(self) -> dict[str, str]:
        """category -> description, from the 'problems' sheet."""
        return {r[0]: r[1] for r in self.sheets.get("problems", [])[1:] if len(r) > 1}

    def overall(self) -> dict[str, float]:
        """'Overall Summary' rows: index name -> share of the E2E time (0..1)."""
        return overall_of(self.sheets)

    def column(self, sheet: str, name: str) -> list[str]:
        rows = self.sheets.get(sheet, [])
        if not rows or name not in rows[0]:
            return []
        i = rows[0].index(name)
        return [r[i] for r in rows[1:] if len(r) > i]


@pytest.fixture(scope="module")
def advisor(tmp_path_factory):
    runs: dict[str, AdvisorRun] = {}

    def run(name: str) -> AdvisorRun:
        if name not in runs:
            base = tmp_path_factory.mktemp(f"advisor_{name}")
            shutil.copytree(FIX / name, base / name)  # the tool may write next to its input
            target = base / name if name == "multi_rank" else next((base / name).glob("*_ascend_pt"))
            runs[name] = AdvisorRun(run_advisor(target, base / "out", command=CMD))
        return runs[name]

    return run


@needs_advisor
@pytest.mark.parametrize("name", ALL)
def test_the_advisor_accepts_every_folder(advisor, name):
    a = advisor(name)
    assert a.rc == 0, a.log[-3000:]
    assert a.html and a.xlsx, a.log[-3000:]
    errors = [ln for ln in a.log.splitlines() if "][ERROR][" in ln]
    if name in ("partial", "malformed"):
        assert errors  # it says what it could not read ...
    else:
        assert errors == []  # ... and reads a complete folder without complaint


@needs_advisor
def test_advisor_host_bound(advisor):
    a, r = advisor("host_bound"), A.analyse_ascend(FIX / "host_bound")
    ov = a.overall()
    assert ov["Free Time"] == pytest.approx(r.breakdown.free_share, abs=0.005) and ov["Free Time"] > 0.10
    assert ov["Computing Time"] == pytest.approx(r.breakdown.computing_share, abs=0.005)
    assert "Operator Dynamic Shape Issues" in a.problems()
    ours = {f.suggestion for f in r.findings if f.rule.startswith("affinity.")}
    theirs = {api.rsplit(".", 1)[-1] for api in a.column("Affinity API Issues", "Affinity API")}
    assert theirs == ours
    compile_calls = one_rule(r, "schedule.online_compile").count
    assert a.column("Operator Dispatch Issues", "counts") == [str(compile_calls)]


@needs_advisor
def test_advisor_compute_bound(advisor):
    a, r = advisor("compute_bound"), A.analyse_ascend(FIX / "compute_bound")
    ov = a.overall()
    assert ov["-- Matmul"] / ov["Computing Time"] == pytest.approx(r.kernel_time.cube_share, abs=0.01)
    assert ov["Free Time"] < 0.10 and ov["Uncovered Communication Time"] == 0.0
    cube = "\n".join(row[1] for row in a.sheets.get("Cube Operator Perf Analysis", [])[1:])
    assert re.search(r"MatMulV2 Op shape: 4096,4096;4096,4096 .* bound type: mac bound", cube), cube
    shapes = {k.input_shapes for k in A.load_ascend_profile(FIX / "compute_bound").kernels
              if A.matmul_inner_axis(k.input_shapes) == one_rule(r, "matmul_alignment").value}
    assert shapes == {"8192,1000;1000,8192"}
    assert re.search(r"Op shape: 8192,1000;1000,8192 .*not divisible by 256", cube), cube


@needs_advisor
def test_advisor_aicpu_and_memory_bound(advisor):
    a, r = advisor("aicpu_mte2"), A.analyse_ascend(FIX / "aicpu_mte2")
    aicpu = set(a.column("AICPU Issues", "op_type"))
    ours = {op for f in r.by_rule("aicpu") for op in f.ops}
    assert ours == {"IndexPut"} and ours <= aicpu  # the advisor lists every AI CPU op once one is over 20 us
    vec = "\n".join(row[1] for row in a.sheets.get("Vector Operator Perf Analysis", [])[1:])
    bound = dict(re.findall(r"aclnn\w+?_(\w+?)AiCore_\w+ Op shape: \S+ dtype: \S+ bound type: (\w+) bound", vec))
    assert {op for op, b in bound.items() if b == "mte2"} == {f.ops[0] for f in r.by_rule("bound.memory")}
    assert {op for op, b in bound.items() if b == "vec"} == {f.ops[0] for f in r.by_rule("bound.vector")}


@needs_advisor
def test_advisor_communication_heavy(advisor):
    a, r = advisor("comm_heavy"), A.analyse_ascend(FIX / "comm_heavy")
    ov = a.overall()
    assert ov["Uncovered Communication Time"] == pytest.approx(r.breakdown.communication_share, abs=0.005)
    assert ov["Uncovered Communication Time"] > A.COMM_BOUND_SHARE
    assert ov["Uncovered Communication Time"] >= ov["Free Time"]
    opt = one_rule(r, "affinity.optimizer")
    apis = a.sheets.get("Affinity API Issues", [])
    assert [(row[0], row[1]) for row in apis[1:]] == [(f"torch_npu.optim.{opt.suggestion}", "train.py(57): <module>")]
    assert opt.source_lines == ["train.py:57"]


@needs_advisor
def test_advisor_partial_and_malformed(advisor):
    p = advisor("partial")
    assert "Overall Summary" not in p.problems()  # no trace_view.json: nothing to split the step with
    m = advisor("malformed")
    assert re.search(r"trace_view\.json failed", m.log), m.log[-3000:]  # the damaged file is named ...
    assert "Vector Operator Perf Analysis" in m.problems()  # ... and kernel_details.csv is still analysed


@needs_advisor
def test_advisor_multi_rank_slow_rank(advisor):
    a = advisor("multi_rank")
    assert re.search(r"Computing\s+has some issues in the cluster", a.problems().get("slow rank", ""))
    rows = a.sheets.get("slow rank", [])[1:]
    compute = {}
    for step, rank, comp, *_ in rows:
        compute.setdefault(int(rank), []).append(float(comp))
    ours = [r.breakdown.computing_us for _, r in A.analyse_ranks(FIX / "multi_rank")]
    assert {k: sum(v) / len(v) for k, v in compute.items()} == dict(enumerate(ours))


def one_rule(r, rule):
    (f,) = [f for f in r.findings if f.rule == rule]
    return f


@needs_advisor
def test_the_advisors_findings_are_read_back_and_join_ours_as_intents(advisor):
    """Issue 20, item 4: the advisor's workbook read by the product, its fused-API findings
    mapped to our catalog's patterns and the user's lines, and folded into the plan's intents."""
    from trainbridge.profile.ascend.intents import profile_intents

    a, r = advisor("host_bound"), A.analyse_ascend(FIX / "host_bound")
    rep = a.report
    assert rep.xlsx and rep.html and rep.returncode == 0
    theirs = [f for f in rep.findings if f.rule == "msprof-analyze.affinity_api"]
    ours = [f for f in r.findings if f.rule.startswith("affinity.")]
    assert theirs and {f.suggestion for f in theirs} == {f.suggestion for f in ours}
    assert {f.pattern for f in theirs} == {f.pattern for f in ours} and None not in {f.pattern for f in theirs}
    assert all(f.source == "msprof-analyze" for f in rep.findings)
    assert any(f.rule == "msprof-analyze.operator_dynamic_shape_issues" for f in rep.findings), \
        [f.rule for f in rep.findings]
    intents = profile_intents(r.model_copy(update={"advisor": rep}))
    by_source = {}
    for i in intents:
        by_source.setdefault(i["source"], set()).add(i["pattern"])
    # the advisor's fused-API patterns are ours; ours add the knobs (schedule, environment) it reports elsewhere
    assert by_source["msprof-analyze"] == {f.pattern for f in ours} <= by_source["trainbridge"]
    assert all(i["summary"].startswith(i["source"]) for i in intents)


@needs_advisor
def test_profile_dir_with_the_advisor_prints_and_keeps_its_findings(tmp_path):
    shutil.copytree(FIX / "host_bound", tmp_path / "host_bound")
    out = tmp_path / "advisor"
    proc = subprocess.run([sys.executable, "-m", "trainbridge.cli", "profile", str(tmp_path / "host_bound"),
                           "--advisor", str(out), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "msprof-analyze advisor" in proc.stdout and "[msprof-analyze]" in proc.stdout, proc.stdout[-3000:]
    kept = json.loads((tmp_path / "r.json").read_text())
    assert kept["advisor"]["findings"] and list(out.glob("mstt_advisor_*.html"))
