"""A run as MLflow runs: one parent run for the TrainBridge run, one nested run per candidate.

For teams that already review experiments in MLflow. Optional: `pip install
'trainbridge[mlflow]'`; without mlflow the export says so in one line. The parent run gets the
run's settings as params, the end-to-end figures as metrics and the ledger, reports and
final program as artifacts; each candidate's run gets its pattern, level, source, decision
and stage as params, its speedup and interval as metrics, and its reason as a tag. The
ledger stays the record: MLflow gets a copy to browse, not the only copy.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from .models import RunFinished, RunStarted
from .store import Ledger

ARTIFACTS = ("ledger.jsonl", "report.html", "report.md", "config.json")


class MlflowExport(BaseModel):
    tracking_uri: str
    experiment: str
    parent_run_id: str
    candidate_runs: int


def export_to_mlflow(run_dir: Path, *, tracking_uri: str | None = None,
                     experiment: str | None = None) -> MlflowExport:
    """Log the run to MLflow (default store: `run_dir/mlruns`, experiment: the workload's name)."""
    try:
        import mlflow
    except ImportError:
        raise ValueError("mlflow is not installed: pip install 'trainbridge[mlflow]' (or mlflow-skinny)") from None
    run_dir = Path(run_dir).resolve()
    ledger = Ledger(run_dir / "ledger.jsonl")
    events = ledger.events()
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    fin = next((e for e in reversed(events) if isinstance(e, RunFinished)), None)
    workload = (started.workload_name or Path(started.workload).name) if started else run_dir.name
    uri = tracking_uri or (run_dir / "mlruns").as_uri()
    if uri.startswith("file:"):
        # MLflow 3 keeps its file store in maintenance and refuses it unless opted in; a local
        # store beside the run needs no server or database, which is what an export wants
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(uri)
    name = experiment or f"trainbridge-{workload}"
    mlflow.set_experiment(name)
    candidates = ledger.candidates()
    with mlflow.start_run(run_name=started.run_id if started else run_dir.name) as parent:
        if started is not None:
            mlflow.log_params({"workload": workload, "target": started.target, "agent": started.agent,
                               "budget_candidates": started.budget_candidates,
                               "budget_minutes": started.budget_minutes})
        metrics = {"candidates": len(candidates)}
        if fin is not None:
            metrics.update(accepted=len(fin.accepted), rejected=len(fin.rejected))
            if fin.final_speedup is not None:
                metrics["final_speedup"] = fin.final_speedup
            if fin.final_ci is not None:
                metrics.update(final_ci_low=fin.final_ci[0], final_ci_high=fin.final_ci[1])
            if fin.compiled_port_speedup is not None:
                metrics["compiled_port_speedup"] = fin.compiled_port_speedup
        mlflow.log_metrics(metrics)
        mlflow.set_tag("trainbridge.run_dir", str(run_dir))
        for rel in ARTIFACTS:
            if (run_dir / rel).is_file():
                mlflow.log_artifact(str(run_dir / rel))
        if (run_dir / "final").is_dir():
            mlflow.log_artifacts(str(run_dir / "final"), artifact_path="final")
        for c in candidates:
            with mlflow.start_run(run_name=c.candidate_id, nested=True):
                mlflow.log_params({"pattern": c.pattern, "level": c.level, "source": c.source,
                                   "decision": c.decision, "stage": c.stage or "-"})
                if c.speedup is not None:
                    mlflow.log_metrics({"speedup": c.speedup, **({"ci_low": c.ci_low, "ci_high": c.ci_high}
                                                                 if c.ci else {})})
                mlflow.set_tag("reason", c.reason[:4000])
        return MlflowExport(tracking_uri=uri, experiment=name, parent_run_id=parent.info.run_id,
                            candidate_runs=len(candidates))
