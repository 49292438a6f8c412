"""report.md is written from the ledger alone, with the typed events."""

from __future__ import annotations

from trainbridge.ledger.report import write_report_md
from trainbridge.ledger.store import Ledger

from tests.ledger.test_ledger import COMP, one_of_each


def test_report_from_a_full_ledger(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    for e in one_of_each():
        led.append(e)
    text = write_report_md(tmp_path, led).read_text()
    assert "# TrainBridge run 20261202-000000-minigpt-cpu" in text
    assert "`train.py:12` device: `'cuda'` -> `'cpu'`; device string" in text
    assert "A/A calibration: false-accept rate" in text
    assert "| c01-fuse | rmsnorm | L1 |" in text and "| 4.0% |" in text and "accepted" in text
    assert f"{COMP.speedup:.3f}x (95% CI {COMP.ci_low:.3f}-{COMP.ci_high:.3f})" in text
    assert "- final vs port: " in text and "- loop ended: budget" in text


def test_report_of_a_run_that_only_started(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    led.append(one_of_each()[0])
    text = write_report_md(tmp_path, led).read_text()
    assert "target: **cpu**" in text and "## Candidates" in text


def test_a_port_change_without_a_note_says_so(tmp_path):
    from trainbridge.ledger import models as ev

    led = Ledger(tmp_path / "ledger.jsonl")
    for e in one_of_each():
        if isinstance(e, ev.PortApplied):
            e = e.model_copy(update={"changes": [ev.PortChangeRecord(file="train_gpt.py", line=166, kind="device",
                                                                     before="'cuda'", after="'cpu'", note="")]})
        led.append(e)
    text = write_report_md(tmp_path, led).read_text()
    assert "`train_gpt.py:166` device: `'cuda'` -> `'cpu'`; no reason recorded" in text
