"""`trainbridge doctor`: what a target needs, what is installed, and how to fix what is not."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
from pathlib import Path

import torch
from pydantic import BaseModel


class Check(BaseModel):
    name: str
    ok: bool
    found: str
    fix: str = ""


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _base_torch(v: str) -> str:
    return v.split("+")[0]


def diagnose(target: str) -> list[Check]:
    checks = [Check(name="torch", ok=True, found=f"{torch.__version__} (threads {torch.get_num_threads()})")]
    triton = _version("triton")
    checks.append(Check(
        name="triton (GPU evidence codegen)", ok=triton is not None, found=triton or "not installed",
        fix="" if triton else "pip install triton  (needed by `trainbridge collect --device cuda`)",
    ))
    if target == "cuda":
        ok = torch.cuda.is_available()
        checks.append(Check(
            name="CUDA device", ok=ok,
            found=(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}" if ok
                   else f"none (torch.version.cuda={torch.version.cuda})"),
            fix="" if ok else "install a CUDA build of torch on a machine with an NVIDIA GPU (README)",
        ))
    if target == "npu":
        npu_v = _version("torch-npu") or _version("torch_npu")
        checks.append(Check(
            name="torch_npu", ok=npu_v is not None, found=npu_v or "not installed",
            fix="" if npu_v else f"pip install torch-npu=={_base_torch(torch.__version__)}  (after CANN; README)",
        ))
        if npu_v:
            match = _base_torch(npu_v).startswith(_base_torch(torch.__version__)[: len(_base_torch(npu_v))])
            checks.append(Check(
                name="torch_npu matches torch", ok=match, found=f"torch-npu {npu_v} / torch {torch.__version__}",
                fix="" if match else f"torch-npu pins torch exactly: install torch=={_base_torch(npu_v)}",
            ))
        home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
        default = Path("/usr/local/Ascend/ascend-toolkit/latest")
        cann = home or (str(default) if default.exists() else None)
        checks.append(Check(
            name="CANN toolkit", ok=cann is not None, found=cann or "not found",
            fix="" if cann else "install CANN and `source /usr/local/Ascend/ascend-toolkit/set_env.sh`",
        ))
        if npu_v and cann:
            try:
                from .npu import NpuTarget

                NpuTarget().check_available()
                checks.append(Check(name="NPU device", ok=True, found=torch.npu.get_device_name()))  # type: ignore[attr-defined]
            except Exception as e:
                checks.append(Check(name="NPU device", ok=False, found=str(e), fix="see the message"))
        autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
        if npu_v and not cann:
            checks.append(Check(
                name="import torch safety", ok=autoload == "0", found=f"TORCH_DEVICE_BACKEND_AUTOLOAD={autoload}",
                fix="export TORCH_DEVICE_BACKEND_AUTOLOAD=0, or `import torch` fails without CANN",
            ))
        for knob, advice in (("ASCEND_LAUNCH_BLOCKING", "unset it: it disables the task queue"),):
            if os.environ.get(knob) == "1":
                checks.append(Check(name=knob, ok=False, found="1", fix=advice))
    if target == "cpu":
        checks.append(Check(name="CPU", ok=True, found=f"{os.cpu_count()} logical cores"))
    spec = importlib.util.find_spec("torch_npu")
    if target != "npu" and spec is not None and os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD") != "0":
        checks.append(Check(name="torch_npu autoload", ok=True, found="torch_npu installed; it autoloads with torch"))
    return checks
