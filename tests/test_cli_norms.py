"""The command line's norms (issue 21): bad input is refused at once, before a single run, with
a one-line reason and exit code 2; flags read the way they are written; `--version`."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from trainbridge.cli import app

from tests.kits.paths import WORKLOADS


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, catch_exceptions=False)


@pytest.mark.parametrize("args, said", [
    (["--target", "foo"], "--target"),
    (["--budget", "-1"], "--budget"),
    (["--pairs", "0"], "--pairs"),
    (["--looks", "0"], "--looks"),
    (["--baseline-runs", "1"], "--baseline-runs"),
    (["--minutes", "-3"], "--minutes"),
    (["--agent", "gpt"], "--agent"),
    (["--timing", "fast"], "--timing"),
    (["--evidence-device", "tpu"], "--evidence-device"),
])
def test_a_bad_number_or_name_is_refused_before_anything_runs(tmp_path, args, said):
    runs = tmp_path / "runs"
    r = _invoke("run", str(WORKLOADS / "nanogpt"), "--runs-root", str(runs), *args)
    assert r.exit_code == 2, r.output
    assert said in r.output and "Traceback" not in r.output
    assert not runs.exists(), "a run folder was made for input that was refused"


def test_version_prints_the_installed_version():
    r = _invoke("--version")
    assert r.exit_code == 0 and re.match(r"trainbridge (\d+\.\d+|\(not installed\))", r.output), r.output


def test_run_help_names_each_flag_once_and_positively():
    r = _invoke("run", "--help")
    assert r.exit_code == 0
    assert "--no-no-" not in r.output and "--no-skip-collect" not in r.output and "--no-allow" not in r.output
    for flag in ("--no-compile-compare", "--skip-collect", "--allow-no-evidence"):
        assert flag in r.output
    assert "cpu" in r.output and "npu" in r.output  # the --target choices are listed


def test_progress_says_which_candidate_of_how_many_the_time_left_and_each_decision_with_its_reason(capsys):
    from trainbridge.cli.progress import RunProgress

    p = RunProgress()
    p.plan(10, 5.0)
    p("measure", candidate="c001-sdpa", detail="lockstep round 1")
    p("decide", candidate="c001-sdpa", decision="accepted", speedup=1.05,
      reason="CI low 1.021 > 1.005: speedup 1.050x, 95% CI [1.021, 1.080]")
    p("plan")
    err = capsys.readouterr().err
    assert "candidate c001-sdpa (1/10)" in err and "min left" in err
    assert "accepted c001-sdpa: CI low 1.021 > 1.005: speedup 1.050x, 95% CI [1.021, 1.080]" in err
    assert "(2/10)" in err and "incumbent 1.05x" in err


def test_run_folders_never_land_inside_the_workload_nor_join_its_program(tmp_path):
    import shutil

    from trainbridge.cli.run import _outside
    from trainbridge.harness.runner import materialize
    from trainbridge.workload import load_workload

    from tests.kits.paths import FIXTURES

    work = tmp_path / "tiny"
    shutil.copytree(FIXTURES / "harness" / "tiny", work)
    assert _outside(work / "runs", work) == tmp_path / "runs"
    assert _outside(tmp_path / "elsewhere", work) == tmp_path / "elsewhere"
    # an earlier run started from inside the workload left its folder there
    old = work / "runs" / "20261207-000000-tiny-cpu"
    (old / "final").mkdir(parents=True)
    (old / "ledger.jsonl").write_text("")
    (old / "final" / "train.py").write_text("raise SystemExit('an old program')\n")
    wl = load_workload(work)
    assert wl.run_folders() == {"runs"}
    assert not any(f.startswith("runs/") for f in wl.source_files() + wl.editable_files())
    dest = materialize(wl, {}, tmp_path / "program")
    assert not (dest / "runs").exists() and (dest / "train.py").exists()


def test_help_lists_each_options_choices():
    out = _invoke("run", "--help").output
    for choice in ("recipes", "llm+recipes", "lockstep", "pairs"):
        assert choice in out, choice
    assert "cuda" in _invoke("collect", "--help").output


def test_debug_shows_the_traceback_that_the_one_line_error_hides(tmp_path):
    plain = CliRunner().invoke(app, ["run", str(tmp_path / "missing")], env={"COLUMNS": "200"})
    assert plain.exit_code == 2 and "Traceback" not in plain.output
    debug = CliRunner().invoke(app, ["--debug", "run", str(tmp_path / "missing")], env={"COLUMNS": "200"})
    assert debug.exit_code == 1 and isinstance(debug.exception, (FileNotFoundError, ValueError)), debug.output


def test_the_packages_log_goes_through_rich_warnings_always_info_with_debug():
    import logging

    from rich.logging import RichHandler

    _invoke("--version")  # eager: the root callback does not run; --help neither
    CliRunner().invoke(app, ["ledger", "show", "/nonexistent"])
    logger = logging.getLogger("trainbridge.agent.rewriters.llm.client")
    root = logging.getLogger("trainbridge")
    assert [type(h) for h in root.handlers].count(RichHandler) == 1
    assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
    CliRunner().invoke(app, ["--debug", "ledger", "show", "/nonexistent"])
    assert [type(h) for h in root.handlers].count(RichHandler) == 1, "a second command must not add a handler"
    assert logger.isEnabledFor(logging.INFO)
