"""One row of `records run`: what happened to one record (records_results.json keeps them all)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .port_check import PortCheck

RecordStatus = Literal["measured", "port_ok", "not_ported", "port_failed", "failed", "skipped", "running"]


class RecordResult(BaseModel):
    key: str
    num: int | None
    name: str
    track: int | None = None
    readme_time: str | None = Field(None, description="the README table's 8xH100 time")
    reference_train_time_ms: float | None = Field(None, description="from the record's own log (its machine)")
    reference_step_avg_ms: float | None = None
    status: RecordStatus = Field(..., description="measured | port_ok (--port-only) | not_ported (a blocker) | "
                                                  "port_failed (the short run failed) | failed | skipped | "
                                                  "running (interrupted; --resume goes on)")
    reason: str = Field("", description="why it was not measured, naming the construct")
    scaled: dict[str, list[str]] = Field(default_factory=dict, description="override name -> where it was set")
    unmatched_overrides: list[str] = Field(default_factory=list)
    scale_problems: list[str] = Field(default_factory=list, description="what the scale override could not "
                                                                        "make consistent")
    port_check: PortCheck | None = None
    run_dir: str | None = None
    port_step_ms: float | None = Field(None, description="median step of the port, end-to-end measurement")
    optimized_step_ms: float | None = None
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    runs: int | None = Field(None, description="process runs per arm in the end-to-end measurement")
    accepted: list[str] = Field(default_factory=list, description="accepted rewrites (recipe or model source)")
    rejected: int = 0
    measured_steps: int | None = Field(None, description="measured steps per timing run (sized by the port check)")
    machine: str | None = Field(None, description="the CPU the row was measured on (its bf16 units decide which "
                                                  "precision recipes apply)")
    gpu_intents: int | None = Field(None, description="GPU evidence intents the loop planned with (0: none; "
                                                      "None: collection not asked for, --skip-collect)")
    evidence_note: str = Field("", description="why a record that was asked for GPU evidence has none")
    loop_wall_s: float | None = Field(None, description="wall time of the record's loop and end-to-end measurement")
