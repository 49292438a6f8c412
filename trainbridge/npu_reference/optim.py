"""Reference torch_npu fused optimizers and npu_apply_adam_w, with their caveat behaviours.

Why: the fused optimizers are not drop-in. They pack every parameter (and its grad) into one
contiguous buffer per dtype on the first step and update the buffer in one pass. So
(1) `zero_grad(set_to_none=True)` raises (it would orphan the packed grads), and
(2) a parameter re-created after construction (`model.cpu()`, `p.data = new`, `p = None`)
leaves the optimizer updating stale memory: the NPU gives "unpredictable results" (docs);
the reference raises instead, so a dry run catches it.
Numerics equal torch.optim.AdamW / Adam / SGD (`step` is tested against them).
"""

from __future__ import annotations

import math

import torch
from torch.optim.optimizer import Optimizer, required


def npu_apply_adam_w(beta1_power, beta2_power, lr, weight_decay, beta1, beta2, epsilon, grad,
                     max_grad_norm, amsgrad, maximize, *, out):
    """One AdamW step in place on out=(var, m, v); returns (var, m, v).

    beta1_power / beta2_power are beta**(step-1), the powers *before* this step: the op
    multiplies by beta once more for the bias correction (op-plugin test_apply_adam_w,
    msprobe's bench function and MindSpeed's adamw all agree). max_grad_norm is AMSGrad's
    running max of v (a Tensor, or None), not a clipping threshold; it is read, not written.
    """
    var, m, v = out
    g = -grad if maximize else grad
    with torch.no_grad():
        b1p, b2p = beta1_power * beta1, beta2_power * beta2
        var.mul_(1.0 - lr * weight_decay)
        m.mul_(beta1).add_(g, alpha=1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        second = torch.maximum(max_grad_norm, v) if amsgrad and max_grad_norm is not None else v
        denom = (second / (1.0 - b2p)).sqrt_().add_(epsilon)
        var.addcdiv_(m, denom, value=-lr / (1.0 - b1p))
    return var, m, v


class ParamsRecreatedError(RuntimeError):
    """A parameter or its gradient was replaced after the fused optimizer packed it."""


class _NpuFusedOptimizerBase(Optimizer):
    """Packs params/grads per dtype into flat buffers on the first step (what the real base does)."""

    def __init__(self, params, defaults):
        super().__init__(params, defaults)
        self._packed = False
        self._flat: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._ptrs: list[tuple[torch.Tensor, int, int]] = []

    def _params(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    yield group, p

    def _pack(self) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for _, p in self._params():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            n = sum(p.numel() for p in ps)
            flat_p = torch.empty(n, dtype=dtype, device=ps[0].device)
            flat_g = torch.empty(n, dtype=dtype, device=ps[0].device)
            off = 0
            for p in ps:
                k = p.numel()
                flat_p[off:off + k].copy_(p.detach().reshape(-1))
                flat_g[off:off + k].copy_(p.grad.reshape(-1))
                p.data = flat_p[off:off + k].view_as(p)
                p.grad = flat_g[off:off + k].view_as(p)
                off += k
            self._flat[dtype] = (flat_p, flat_g)
        self._ptrs = [(p, p.data_ptr(), p.grad.data_ptr()) for _, p in self._params()]
        self._packed = True

    def _check_packed(self) -> None:
        for p, pp, gp in self._ptrs:
            if p.grad is None:
                raise ParamsRecreatedError(
                    "fused optimizer: a parameter's grad was set to None after packing "
                    "(zero_grad(set_to_none=True) or `p.grad = None`); use zero_grad() / set_to_none=False")
            if p.data_ptr() != pp or p.grad.data_ptr() != gp:
                raise ParamsRecreatedError(
                    "fused optimizer: a parameter (or its grad) was re-created after construction "
                    "(model.cpu()/.to(), `p.data = ...`, `p.grad = ...`); torch_npu then updates stale "
                    "buffers. Build the optimizer after the model is final and only modify params in place.")

    def zero_grad(self, set_to_none: bool = False) -> None:
        if set_to_none:
            raise ValueError("torch_npu fused optimizers do not support zero_grad(set_to_none=True): "
                             "call zero_grad() (set_to_none=False)")
        if self._packed:
            for _, flat_g in self._flat.values():
                flat_g.zero_()
            return
        for _, p in self._params():
            if p.grad is not None:
                p.grad = p.grad.detach()
                p.grad.zero_()

    @torch.no_grad()
    def clip_grad_norm_fused_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip all packed grads together; the total norm before clipping is returned."""
        if not self._packed:
            self._pack()
        self._check_packed()
        grads = [g for _, g in self._flat.values()]
        if norm_type == math.inf:
            total = max(g.abs().max().float() for g in grads)
        else:
            total = torch.norm(torch.stack([torch.norm(g.float(), norm_type) for g in grads]), norm_type)
        coef = max_norm / (float(total) + 1e-6)
        if coef < 1:
            for g in grads:
                g.mul_(coef)
        return total

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._packed:
            self._pack()
        self._check_packed()
        for group in self.param_groups:
            ps = [p for p in group["params"] if p.requires_grad]
            if ps:
                self._group_step(group, ps)
        return loss

    def _group_step(self, group, params) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class NpuFusedAdamW(_NpuFusedOptimizerBase):
    """torch.optim.AdamW semantics (decoupled weight decay), one npu_apply_adam_w per param."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        _check_hparams(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    def _group_step(self, group, params) -> None:
        b1, b2 = group["betas"]
        for p in params:
            st = self.state[p]
            if not st:
                st["step"] = 0
                st["exp_avg"] = torch.zeros_like(p)
                st["exp_avg_sq"] = torch.zeros_like(p)
                if group["amsgrad"]:
                    st["max_exp_avg_sq"] = torch.zeros_like(p)
            st["step"] += 1
            t = st["step"]
            mx = st.get("max_exp_avg_sq")
            npu_apply_adam_w(b1 ** (t - 1), b2 ** (t - 1), group["lr"], group["weight_decay"], b1, b2,
                             group["eps"], p.grad, mx, group["amsgrad"], False,
                             out=(p.data, st["exp_avg"], st["exp_avg_sq"]))
            if mx is not None:
                torch.maximum(mx, st["exp_avg_sq"], out=mx)


class NpuFusedAdam(_NpuFusedOptimizerBase):
    """torch.optim.Adam semantics (L2 weight decay added to the gradient)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False):
        _check_hparams(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))

    def _group_step(self, group, params) -> None:
        b1, b2 = group["betas"]
        for p in params:
            st = self.state[p]
            if not st:
                st["step"] = 0
                st["exp_avg"] = torch.zeros_like(p)
                st["exp_avg_sq"] = torch.zeros_like(p)
                if group["amsgrad"]:
                    st["max_exp_avg_sq"] = torch.zeros_like(p)
            st["step"] += 1
            t = st["step"]
            g = p.grad if group["weight_decay"] == 0 else p.grad.add(p, alpha=group["weight_decay"])
            m, v = st["exp_avg"], st["exp_avg_sq"]
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            second = v
            if group["amsgrad"]:
                torch.maximum(st["max_exp_avg_sq"], v, out=st["max_exp_avg_sq"])
                second = st["max_exp_avg_sq"]
            denom = (second.sqrt() / math.sqrt(1 - b2 ** t)).add_(group["eps"])
            p.addcdiv_(m, denom, value=-group["lr"] / (1 - b1 ** t))


class NpuFusedSGD(_NpuFusedOptimizerBase):
    """torch.optim.SGD semantics (momentum, dampening, nesterov, L2 weight decay)."""

    def __init__(self, params, lr=required, momentum=0, dampening=0, weight_decay=0, nesterov=False):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0 or weight_decay < 0.0:
            raise ValueError("Invalid momentum / weight_decay value")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    def _group_step(self, group, params) -> None:
        for p in params:
            g = p.grad if group["weight_decay"] == 0 else p.grad.add(p, alpha=group["weight_decay"])
            if group["momentum"] != 0:
                st = self.state[p]
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = st["momentum_buffer"] = g.clone()
                else:
                    buf.mul_(group["momentum"]).add_(g, alpha=1 - group["dampening"])
                g = g.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
            p.add_(g, alpha=-group["lr"])


def _check_hparams(lr, betas, eps, weight_decay) -> None:
    if lr < 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")
    if eps < 0.0:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not (0.0 <= betas[0] <= 1.0 and 0.0 <= betas[1] <= 1.0):
        raise ValueError(f"Invalid beta parameters: {betas}")
    if weight_decay < 0.0:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
