"""Collectives the CPU's gloo backend runs but cannot hand back as futures.

TrainBridge runs a ported program as one rank of a real process group (gloo on the CPU), so
its all_reduce / all_gather / reduce_scatter calls execute as written. Gloo's reduce_scatter
work objects have no `get_future()` ("Work::getFuture not implemented"), which programs that
overlap communication with compute call on every step. These wrappers run the same
collective and, when asked for a future, wait for the work and return a completed one
holding the output, as the NCCL future would after `wait()`.

NCCL's tensor-form collectives take any output/input shapes whose sizes agree (a
`(world_size, n)` buffer gathered from an `n` vector); gloo checks the first dimension, so
the tensor forms run on flat views and copy back where a tensor cannot be viewed flat.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _CompletedWork:
    """A finished collective that answers wait() and get_future() like NCCL's work object."""

    def __init__(self, work, output):
        self._work = work
        self._output = output

    def wait(self, timeout=None):
        if self._work is not None:
            self._work.wait()
            self._work = None
        return True

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def get_future(self) -> torch.futures.Future:
        self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result([self._output])
        return fut


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1) if t.is_contiguous() else t.reshape(-1).clone()


def _tensor_form(collective, output, input, async_op, **kw):
    flat_out = _flat(output)
    work = collective(flat_out, _flat(input), async_op=async_op, **kw)
    if flat_out.data_ptr() != output.data_ptr():  # a copy: finish, then write back
        if work is not None:
            work.wait()
            work = None
        output.copy_(flat_out.view(output.shape))
    return _CompletedWork(work, output) if async_op else work


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    return _tensor_form(dist.reduce_scatter_tensor, output, input, async_op, op=op, group=group)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    return _tensor_form(dist.all_gather_into_tensor, output_tensor, input_tensor, async_op, group=group)


def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
    work = dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
    return _CompletedWork(work, output) if async_op else work
