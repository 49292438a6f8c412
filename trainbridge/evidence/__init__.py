"""GPU evidence: what Inductor does with a training step, turned into optimization intents.

Public entry points (imported lazily, so loading a bundle does not import torch):

- `collect_inprocess(model, optimizers, step_fn, *, device, source_root, workload_name)`
  -> EvidenceBundle: capture in this process (tests, notebooks).
- `InductorCapturePlugin` (`trainbridge.evidence.capture:InductorCapturePlugin`): the same
  capture as a harness plugin for an unmodified program; writes a raw capture JSON.
- `build_bundle(raw_capture_json_path, *, source_root, workload_name, route)` -> EvidenceBundle.
- `import_debug_output(path, *, source_root)` -> EvidenceBundle: a TORCH_COMPILE_DEBUG folder,
  an output_code.py or a TORCH_LOGS=output_code log from a real GPU run.
- `collect_workload(workload, *, device, out_dir)` -> EvidenceBundle: run a workload in the
  harness with the plugin and build its bundle.
- `EvidenceBundle`, `write_schema(path)`, `render_summary(bundle, console)`.
"""

from __future__ import annotations

_EXPORTS = {
    "EvidenceBundle": "bundle", "write_schema": "bundle", "render_summary": "bundle",
    "RawCapture": "raw",
    "capture_step": "capture", "InductorCapturePlugin": "capture", "CaptureSession": "capture_session",
    "collect_inprocess": "api", "build_bundle": "api", "import_debug_output": "importer",
    "collect_workload": "collect",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        mod = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
