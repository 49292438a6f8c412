"""What `trainbridge records extract` writes (records.json) and `records run` reads."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, Field

LogFormat = Literal["code_between_separators", "code_first", "no_code"]


class StepLine(BaseModel):
    """One `step:N/M ...` line of a record log (val_loss or train_loss may be absent)."""

    step: int
    total_steps: int
    val_loss: float | None = None
    train_loss: float | None = None
    train_time_ms: int
    step_avg_ms: float | None = Field(None, description="None where the log printed nan")


class ParsedLog(BaseModel):
    """One log file: the script it embeds (if any) and its timing lines."""

    path: str
    format: LogFormat
    script: str | None = Field(None, description="the main training script embedded in the log")
    extra_files: dict[str, str] = Field(default_factory=dict, description="files appended after the script (record 61 on)")
    script_parses: bool | None = Field(None, description="whether the embedded script is valid Python")
    torch_version: str | None = None
    steps: list[StepLine] = Field(default_factory=list)
    final_val_loss: float | None = Field(None, description="the last val_loss line: the run's result")
    final_train_time_ms: int | None = None
    final_step_avg_ms: float | None = None
    peak_memory_mib: int | None = None
    script_sha256: str | None = Field(None, description="the embedded script's digest; in records.json the text "
                                                         "itself is kept once, on the record (compact)")
    step_lines: int | None = Field(None, description="timing lines the log had; records.json keeps the "
                                                     "validation lines and the last one (compact)")

    def compact(self) -> "ParsedLog":
        """The log as records.json keeps it: a checkout's ~1,200 logs embed the same scripts and
        ~1,000 step lines each (380 MB of JSON, 3 GB in memory); its digest, validation curve
        and final line are what a reader of the index uses."""
        keep = [s for s in self.steps if s.val_loss is not None]
        if self.steps and (not keep or keep[-1] is not self.steps[-1]):
            keep.append(self.steps[-1])
        digest = hashlib.sha256(self.script.encode()).hexdigest() if self.script else self.script_sha256
        return self.model_copy(update={"script": None, "extra_files": {}, "script_sha256": digest, "steps": keep,
                                       "step_lines": len(self.steps) if self.step_lines is None else self.step_lines})


class KnownRecord(BaseModel):
    """A row of the Modded-NanoGPT README table (trainbridge/records/known_records.tsv)."""

    num: int
    record_time: str = Field(..., description="as the README table gives it, e.g. '3.28 minutes'")
    date: str
    description: str
    log_link: str = ""


class RecordEntry(BaseModel):
    """One record found under the extracted path."""

    key: str = Field(..., description="the record's folder name (its path when two tracks share a name), "
                                      "unique in this extraction")
    num: int | None = Field(None, description="record number from the README table; None when unmatched")
    track: int | None = Field(None, description="1 short, 2 medium, 3 optimization (from `records/track_N_*`; the "
                                                "older `records/<folder>` layout is track 1); None outside a checkout")
    name: str
    date: str | None = Field(None, description="ISO date from the folder name")
    description: str = ""
    readme_time: str | None = Field(None, description="the README table's time for this record (8xH100)")
    logs: list[ParsedLog] = Field(default_factory=list)
    script_log: str | None = Field(None, description="path of the log the script was taken from")
    variant: str | None = Field(None, description="the subfolder of the record folder whose logs give the script "
                                                  "and timings; None: the record folder itself")
    variant_reason: str = Field("", description="why this variant: the README's log link, the only one, or the "
                                                "newest of several")
    other_variants: dict[str, int] = Field(default_factory=dict, description="other subfolders with logs (not "
                                           "baselines) -> how many logs; their logs are not in `logs`")
    baseline_logs: int = Field(0, description="logs of the PR's comparison run (baseline/, *-baseline-*, prior/, "
                                              "master-*, comparison_*), skipped")
    note: str = Field("", description="anything a reader should know about how the entry was matched")
    script: str | None = None
    extra_files: dict[str, str] = Field(default_factory=dict)
    no_script_reason: str | None = Field(None, description="why there is no script (llm.c log, no log ...)")
    reference_train_time_ms: float | None = Field(None, description="median final train_time over the logs")
    reference_step_avg_ms: float | None = Field(None, description="median final step_avg over the logs")
    reference_val_loss: float | None = Field(None, description="median final val_loss over the logs")


class RecordIndex(BaseModel):
    """records.json: everything `extract` found, in record order."""

    source: str
    records: list[RecordEntry]
