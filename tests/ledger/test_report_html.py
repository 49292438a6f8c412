"""report.html: one self-contained page a reviewer reads instead of the ledger.

The page is built from a ledger written here (an accepted candidate with its timing, a
rejected one with an LLM-written reason full of markup, a port change with no note) and the
run folder's files the page reads (validation losses, the evidence bundle). Where Debian's
Chromium is installed (`.ci/run` installs it), the page is also opened headless from disk:
every card and chart is in the rendered DOM, the page loads nothing (the browser's resource
timing lists no request), and the screenshot is a real page, not a blank one.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess

import pytest

from trainbridge.ledger import models as ev
from trainbridge.ledger.report_html import waterfall_svg, write_report_html
from trainbridge.measure.prediction import PredictionCheck
from trainbridge.ledger.store import Ledger
from trainbridge.ledger.summary import verdict_line
from trainbridge.measure.statistics import compare

from tests.ledger.test_ledger import CAND, HYP, INC, RUN, T, one_of_each

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MARKUP_REASON = "loss <b>3%</b> off at step 3 & <script>alert(1)</script>"


def _run_folder(tmp_path):
    """A finished run: c01-fuse accepted (timed), c02-attn rejected at correctness, and a port
    change with no note."""
    run_dir = tmp_path / RUN
    led = Ledger(run_dir / "ledger.jsonl")
    b = {"run_id": RUN, "time_utc": T}
    for e in one_of_each():
        if isinstance(e, ev.PortApplied):
            e = e.model_copy(update={"changes": [*e.changes, ev.PortChangeRecord(
                file="train.py", line=40, kind="precision", before="torch.bfloat16", after="torch.float32",
                semantic_change=True, note="")]})
        if isinstance(e, ev.CandidateDecided):
            led.append(e)
            led.append(ev.CandidateProposed(**b, candidate_id="c02-attn", intent_id="attention@train.py:20",
                                            pattern="attention", level="L1", gap_class="fusion",
                                            source="llm:fake", mechanism="SDPA", hypothesis=ev.HypothesisRecord(**HYP),
                                            diff="--- a/train.py\n+++ b/train.py\n-att = q @ k\n+att = sdpa(q, k, v)\n",
                                            files=["train.py"]))
            led.append(ev.CandidateValidated(**b, candidate_id="c02-attn", passed=False, stage="correctness",
                                             reason=MARKUP_REASON))
            led.append(ev.CandidateDecided(**b, candidate_id="c02-attn", decision="rejected", reason=MARKUP_REASON))
            continue
        if isinstance(e, ev.RunFinished):
            e = e.model_copy(update={"rejected": ["c02-attn"]})
        led.append(e)
    steps = lambda losses: {"steps": [{"index": i, "loss": x} for i, x in enumerate(losses, 1)]}  # noqa: E731
    (run_dir / "baseline_ref.json").write_text(json.dumps(steps([4.0, 3.6, 3.3, 3.1])))
    (run_dir / "candidates" / "c01-fuse").mkdir(parents=True)
    (run_dir / "candidates" / "c01-fuse" / "validate_ref.json").write_text(json.dumps(steps([4.0, 3.6, 3.31, 3.1])))
    (run_dir / "evidence.json").write_text(json.dumps({"intents": [
        {"id": "i7", "summary": "RMSNorm fused by the compiler", "eager_ops": ["aten::pow", "aten::mean"],
         "eager_ops_removed": 5, "spans": [{"file": "train.py", "start_line": 12, "end_line": 14}],
         "evidence": {"kernels": ["triton_per_fused_mean_pow_rsqrt_0"]}}]}))
    return run_dir, led


def test_the_page_has_the_verdict_a_card_per_candidate_and_every_chart(tmp_path):
    run_dir, led = _run_folder(tmp_path)
    page = write_report_html(run_dir, led).read_text()
    fin = next(e for e in led.events() if isinstance(e, ev.RunFinished))
    assert re.search(r"<p class='verdict [a-z]*' id='verdict'>" + re.escape(verdict_line(fin).replace("'", "&#x27;")),
                     page), page[:2000]
    assert re.findall(r"data-decision='(\w+)'", page) == ["accepted", "rejected"]
    assert re.findall(r"data-chart='(\w+)'", page) == ["waterfall", "steps", "losses"]
    assert page.count("<svg") == 3
    # the GPU side of the accepted card: kernel, fused ops and source lines from the bundle
    assert "triton_per_fused_mean_pow_rsqrt_0" in page and "train.py:12-14" in page
    # the rejected card names its stage; text written by a model is shown, never interpreted
    assert "failed at stage <b>correctness</b>" in page
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # the port change with no note says so
    assert "no reason recorded" in page and "(semantic change)" in page
    # the machine
    assert "torch" in page and "2.13.0" in page


def test_a_chart_that_cannot_be_drawn_says_why_and_the_page_is_still_written(tmp_path, monkeypatch, caplog):
    import trainbridge.ledger.report_html as report_html

    def broken(*_):
        raise ValueError("'yerr' must not contain <negative> values")

    monkeypatch.setattr(report_html, "waterfall_svg", broken)
    run_dir, led = _run_folder(tmp_path)
    page = write_report_html(run_dir, led).read_text()
    assert re.findall(r"data-chart='(\w+)'", page) == ["waterfall", "steps", "losses"]
    assert page.count("<svg") == 2
    assert "chart not drawn: &#x27;yerr&#x27; must not contain &lt;negative&gt; values" in page
    assert "waterfall chart could not be drawn" in caplog.text


def test_nothing_is_loaded_from_elsewhere(tmp_path):
    run_dir, led = _run_folder(tmp_path)
    page = write_report_html(run_dir, led).read_text()
    assert "<script" not in page and "<link" not in page and "<img" not in page and "@import" not in page
    # attributes that make a browser fetch: none points anywhere (SVG namespace URIs are names, not requests)
    fetched = re.findall(r"""(?:src|href|xlink:href)\s*=\s*["']([^"'#][^"']*)["']""", page)
    assert fetched == [], fetched
    assert "url(http" not in page


def test_the_prediction_miss_is_said_with_its_size():
    comp = compare(INC, CAND, n_boot=200)  # about 9-10% of the step saved
    check = PredictionCheck.of(2.9, comp)  # 2.9 ms of a 10 ms step
    assert check.missed_by_pct > 15 and "overstated by" in check.sentence()
    assert check.far and "far from its prediction" in check.sentence()
    near = PredictionCheck.of(check.measured_ms, comp)
    assert near.missed_by_pct == 0.0 and not near.far
    low = PredictionCheck.of(0.1, comp)
    assert "understated by" in low.sentence() and low.far  # faster than predicted is flagged too


@pytest.mark.parametrize("where", ["one_ulp_above", "below_the_interval"])
def test_the_waterfall_draws_a_final_figure_that_lies_outside_its_interval(where):
    """A percentile interval need not hold its point estimate: with tied step times it can be a
    single value one rounding error below it (a CI run of one pair died on matplotlib's negative
    `yerr`), and a bootstrap of medians can sit wholly beside it."""
    comp = compare(INC, CAND, n_boot=200)
    if where == "one_ulp_above":
        comp = comp.model_copy(update={"ci_low": comp.speedup - 2e-16, "ci_high": comp.speedup - 2e-16})
    else:
        comp = comp.model_copy(update={"ci_low": comp.speedup + 0.01, "ci_high": comp.speedup + 0.03})
    svg = waterfall_svg([("c01-fuse", 1.05)], comp)
    assert svg.startswith("<svg") and "final vs port" in svg


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_page_renders_in_headless_chromium_from_disk_without_a_request(tmp_path):
    run_dir, led = _run_folder(tmp_path)
    page = write_report_html(run_dir, led)
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-default-apps", f"--user-data-dir={tmp_path / 'profile'}",
              "--host-resolver-rules=MAP * ~NOTFOUND"]  # a request by name fails at once, and is listed
    url = page.resolve().as_uri()
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert len(re.findall(r'class="card"', dom.stdout)) == 2
    assert len(re.findall(r"<svg", dom.stdout)) == 3 and 'id="verdict"' in dom.stdout
    # what the page itself loaded, as the browser's resource timing lists it (the browser's own
    # update and account pings are not the page's): a probe copy records it into its DOM
    def loaded(text: str) -> str:
        probe = page.with_name("probe.html")
        # after the load event: every request the page made has finished or failed by then (a
        # request that hangs keeps the event from firing, and the probe from writing: a failure too)
        probe.write_text(text.replace("</body>", "<script>addEventListener('load', () => document.body"
                                      ".setAttribute('data-loaded', JSON.stringify(performance"
                                      ".getEntriesByType('resource').map(e => e.name))))</script></body>"))
        out = subprocess.run([*common, "--virtual-time-budget=2000", "--dump-dom", probe.resolve().as_uri()],
                             capture_output=True, text=True, timeout=120)
        found = re.search(r'data-loaded="([^"]*)"', out.stdout)
        assert found is not None, out.stdout[-1000:]
        return found.group(1)

    assert loaded(page.read_text()) == "[]"
    # the probe sees a request when there is one (an image from elsewhere put into the page)
    attack = "<img src='http://report-probe.invalid/x.png'><h1>"
    assert "report-probe.invalid" in loaded(page.read_text().replace("<h1>", attack, 1))
    shot = tmp_path / "shot.png"
    proc = subprocess.run([*common, f"--screenshot={shot}", "--window-size=1200,2400", url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    width, height = _png_size(shot)
    assert (width, height) == (1200, 2400)
    assert shot.stat().st_size > 30_000, "the screenshot is near blank"


def test_ledger_report_writes_both_reports_again(tmp_path):
    from typer.testing import CliRunner

    from trainbridge.cli import app

    run_dir, _ = _run_folder(tmp_path)
    out = CliRunner().invoke(app, ["ledger", "report", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert (run_dir / "report.html").read_text().count("class='card'") == 2
    assert "c02-attn" in (run_dir / "report.md").read_text()
