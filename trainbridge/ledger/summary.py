"""The run's headline in words: its verdict and whether it had GPU evidence.

One wording for the console summary, `ledger show` and report.md, so a run that lost its GPU
evidence says so in the same words everywhere a person looks.
"""

from __future__ import annotations

from .models import EvidenceLoaded, RunFinished

# `trainbridge run` exits with this code when the run was asked for GPU evidence and had none
# (2 is kept for errors in what the user typed).
EXIT_NO_EVIDENCE = 3


def verdict_line(fin: RunFinished | None) -> str:
    """What the end-to-end measurement confirms, with its interval."""
    if fin is None:
        return "the run has not finished"
    if not fin.accepted:
        # the final program is the port: its end-to-end row is an A/A check of the machine's noise
        return f"no rewrite accepted ({len(fin.rejected)} rejected): the final program is the port"
    e2e = fin.end_to_end
    fvp = e2e.final_vs_port
    if fvp is None:
        return "final program not measured end to end" + (f" ({e2e.note})" if e2e.note else "")
    if fvp.ci_low > 1.0:
        said = "faster than the port"
    elif fvp.ci_high < 1.0:
        said = "slower than the port"
    else:
        said = "not confirmed faster than the port (the interval includes 1)"
    line = (f"final program {fvp.speedup:.2f}x the port ({fvp.confidence:.0%} CI {fvp.ci_low:.2f}-{fvp.ci_high:.2f}): "
            f"{said}")
    cvc = e2e.final_vs_compiled_port
    if cvc is not None:
        line += f"; {cvc.speedup:.2f}x torch.compile of the port (CI {cvc.ci_low:.2f}-{cvc.ci_high:.2f})"
    return line


def evidence_line(e: EvidenceLoaded | None) -> str:
    """How many GPU intents the plan had, and where they came from; loud when there were none."""
    if e is None:
        return "GPU evidence: not reached"
    if e.missing:
        return (f"NO GPU EVIDENCE: {e.missing}. The plan used the target profile only. "
                "Fix the cause and rerun, or pass --allow-no-evidence (or --skip-collect) to accept this.")
    if e.source == "skipped":
        return "GPU evidence: none (--skip-collect); planned from the target profile only"
    if e.intents == 0:
        return f"GPU evidence: none ({e.error or e.note}); allowed by --allow-no-evidence"
    where = {"file": "from the given bundle", "collected": "collected in this run"}.get(e.source or "", e.note)
    return f"GPU evidence: {e.intents} intents, {where}"


def evidence_event(events) -> EvidenceLoaded | None:
    return next((x for x in reversed(list(events)) if isinstance(x, EvidenceLoaded)), None)
