"""The harness as torchrun for one rank.

GPU training programs are launched by `torchrun --nproc_per_node=8`, which gives each
process `RANK`, `LOCAL_RANK`, `WORLD_SIZE` and a rendezvous address; the programs read them
with `os.environ["RANK"]` (a KeyError without torchrun) and open a process group on them.
The harness gives every child the same variables for rank 0 of a world of 1, with a free
local port, so `dist.init_process_group` builds a real one-rank group (gloo on the cpu,
HCCL on the npu) and the program's collectives run as written. A variable the user or the
manifest already set wins.

Only programs that cannot start without torchrun get them (`requires_torchrun`): a program
that checks `"RANK" in os.environ` and runs as a single process otherwise keeps doing so,
as it would when started with plain `python`.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping

# os.environ["RANK"] (no default): the program fails with a KeyError unless torchrun started it
_REQUIRED = re.compile(r"""environ\[\s*['"](RANK|LOCAL_RANK|WORLD_SIZE)['"]\s*\]""")


def requires_torchrun(sources: Mapping[str, str]) -> bool:
    """Whether the program reads a torchrun variable it cannot do without."""
    return any(rel.endswith(".py") and _REQUIRED.search(text) for rel, text in sources.items())


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(current: Mapping[str, str]) -> dict[str, str]:
    """The torchrun variables of rank 0 in a world of 1, for those `current` does not set."""
    one_rank = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
                "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    out = {k: v for k, v in one_rank.items() if k not in current}
    if "MASTER_PORT" not in current:
        out["MASTER_PORT"] = str(free_port())
    return out
