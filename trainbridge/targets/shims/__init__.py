"""Replacement modules a port copies into the program folder as `_tb_<name>.py`.

Each file here is self-contained (it imports torch, and torch_npu only on the npu target,
never trainbridge): the ported program must run where TrainBridge is not installed, and a
person reviewing the port reads the replacement next to the program. The feature porters in
`targets/features/` decide when a shim is needed and rewrite the program to import it.
"""

from __future__ import annotations

from importlib import resources

SHIM_PREFIX = "_tb_"


def shim_source(name: str) -> str:
    """The text of shim `name` (the module `trainbridge/targets/shims/<name>.py`)."""
    return resources.files(__package__).joinpath(f"{name}.py").read_text(encoding="utf-8")


def shim_filename(name: str) -> str:
    """Where the shim lands in the ported program: `_tb_<name>.py`, beside the entry script."""
    return f"{SHIM_PREFIX}{name}.py"


def add_shim(files: dict[str, str], name: str) -> dict[str, str]:
    """`files` with shim `name` added (unchanged if it is already there)."""
    out = dict(files)
    out.setdefault(shim_filename(name), shim_source(name))
    return out
