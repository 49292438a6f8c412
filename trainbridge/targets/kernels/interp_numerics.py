"""Make Triton's CPU interpreter compute bfloat16 and float8 the way the GPU does.

The interpreter (`TRITON_INTERPRET=1`) keeps bfloat16 tensors as uint16 and float8 tensors as
uint8 bit patterns, and several of its operations work on those integers instead of the values
they encode: `tl.dot` multiplies bit patterns, arithmetic and comparisons on bf16 operands use
integer math, `tl.max`/`tl.sum` reduce bit patterns, float32 -> bfloat16 truncates instead of
rounding to nearest even, and int -> bf16 casts copy the integer. Checking a record's kernels
against a PyTorch replacement needs the kernel's real numbers, so `install()` wraps exactly those
builder operations: low-precision operands are widened to float32 (exact), the operation runs in
float32, and a low-precision result is rounded back to nearest even, which is what the GPU's
bf16 instructions and conversions do. Conversions to float8 saturate to the largest finite
value (the `satfinite` conversions Triton emits on NVIDIA GPUs).

Nothing here changes a kernel's source or what it computes; it only replaces the interpreter's
value arithmetic for dtypes numpy lacks. Installed only inside the check subprocess.
"""

from __future__ import annotations

import numpy as np
import torch

_installed = False


def _low_dtypes():
    import triton.language as tl

    return {
        tl.bfloat16: (torch.bfloat16, np.int16),
        tl.float8e5: (torch.float8_e5m2, np.int8),
        tl.float8e4nv: (torch.float8_e4m3fn, np.int8),
    }


def install() -> None:
    """Patch the interpreter once in this process (idempotent)."""
    global _installed
    if _installed:
        return
    import triton.language as tl
    from triton.runtime import interpreter as itp

    low = _low_dtypes()
    torch_of = {tl.float32: torch.float32, tl.float16: torch.float16, tl.float64: torch.float64}
    np_of = {tl.float32: np.int32, tl.float16: np.int16, tl.float64: np.int64}
    for tt, (td, nd) in low.items():
        torch_of[tt] = td
        np_of[tt] = nd

    def scalar(tt):
        return getattr(tt, "scalar", tt)

    def widen(data, tt) -> np.ndarray:
        """Bit patterns of low-precision type `tt` -> float32 values."""
        td, nd = low[scalar(tt)]
        arr = np.ascontiguousarray(np.asarray(data)).view(nd)
        return torch.from_numpy(arr.copy()).view(td).float().numpy()

    def narrow(values, tt) -> np.ndarray:
        """float32 values -> bit patterns of low-precision type `tt`, round to nearest even."""
        td, nd = low[scalar(tt)]
        t = torch.from_numpy(np.ascontiguousarray(np.asarray(values, dtype=np.float32)))
        if td in (torch.float8_e5m2, torch.float8_e4m3fn):
            big = torch.finfo(td).max
            t = torch.where(t.isnan(), t, t.clamp(-big, big))
        out = t.to(td).view(torch.int16 if nd is np.int16 else torch.int8).numpy()
        return out.view(np.uint16 if nd is np.int16 else np.uint8)

    orig_convert = itp._convert_float

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        rtz = rounding_mode is not None and rounding_mode == itp._ir.ROUNDING_MODE.RTZ
        if rtz or input_dtype not in torch_of or output_dtype not in torch_of:
            return orig_convert(input, input_dtype, output_dtype, rounding_mode)
        src = np.ascontiguousarray(np.asarray(input)).view(np_of[input_dtype])
        t = torch.from_numpy(src.copy()).view(torch_of[input_dtype]).float()
        if output_dtype in low:
            return narrow(t.numpy(), output_dtype).reshape(np.shape(input))
        bits = np.dtype(f"uint{output_dtype.primitive_bitwidth}")
        return t.to(torch_of[output_dtype]).numpy().view(bits).reshape(np.shape(input))

    itp._convert_float = convert_float
    B = itp.InterpreterBuilder

    orig_cast = B.cast_impl

    def cast_impl(self, src, dst_type):
        s, d = scalar(src.dtype), scalar(dst_type)
        if s in low and d in low and s != d:
            return itp.TensorHandle(narrow(widen(src.data, s), d), d)
        if d in low and s not in low and s not in torch_of:  # integer -> low float
            return itp.TensorHandle(narrow(src.data.astype(np.float32), d), d)
        if s in low and d not in low and d not in torch_of:  # low float -> integer
            return itp.TensorHandle(widen(src.data, s).astype(itp._get_np_dtype(dst_type)), d)
        if s in low and d in (tl.float16, tl.float64):
            return itp.TensorHandle(widen(src.data, s).astype(itp._get_np_dtype(dst_type)), d)
        if d in low and s in (tl.float16, tl.float64):
            return itp.TensorHandle(narrow(src.data.astype(np.float32), d), d)
        return orig_cast(self, src, dst_type)

    B.cast_impl = cast_impl
    for name in ("create_si_to_fp", "create_ui_to_fp", "create_fp_to_si", "create_fp_to_ui", "create_fp_ext",
                 "create_fp_trunc"):
        setattr(B, name, lambda self, src, dst_type: self.cast_impl(src, dst_type))

    orig_binary = B.binary_op

    def binary_op(self, lhs, rhs, op):
        tt = scalar(lhs.dtype)
        if tt not in low or scalar(rhs.dtype) != tt:
            return orig_binary(self, lhs, rhs, op)
        out = op(widen(lhs.data, tt), widen(rhs.data, tt))
        if out.dtype == np.bool_:
            return itp.TensorHandle(out, tt)
        return itp.TensorHandle(narrow(out, tt), tt)

    B.binary_op = binary_op

    orig_unary = B.unary_op

    def unary_op(self, arg, op):
        tt = scalar(arg.dtype)
        if tt not in low:
            return orig_unary(self, arg, op)
        return itp.TensorHandle(narrow(op(widen(arg.data, tt)), tt), tt)

    B.unary_op = unary_op

    orig_fma = B.create_fma

    def create_fma(self, x, y, z):
        tt = scalar(z.dtype)
        if tt not in low:
            return orig_fma(self, x, y, z)
        f = [widen(h.data, tt).astype(np.float64) for h in (x, y, z)]
        return itp.TensorHandle(narrow((f[0] * f[1] + f[2]).astype(np.float32), tt), tt)

    B.create_fma = create_fma

    orig_dot = B.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        ta, tb, td = scalar(a.dtype), scalar(b.dtype), scalar(d.dtype)
        if ta not in low and tb not in low and td not in low:
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        av = widen(a.data, ta) if ta in low else a.data.astype(np.float32)
        bv = widen(b.data, tb) if tb in low else b.data.astype(np.float32)
        dv = widen(d.data, td) if td in low else d.data.astype(np.float32)
        out = np.matmul(av, bv, dtype=np.float32) + dv
        if td in low:
            return itp.TensorHandle(narrow(out, td), td)
        return itp.TensorHandle(out.astype(d.data.dtype), td)

    B.create_dot = create_dot

    orig_atomic = B.create_atomic_rmw

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        tt = scalar(val.dtype)
        ops = {itp._ir.ATOMIC_OP.FADD: np.add, itp._ir.ATOMIC_OP.MAX: np.maximum,
               itp._ir.ATOMIC_OP.MIN: np.minimum, itp._ir.ATOMIC_OP.XCHG: lambda old, new: new}
        if tt not in low or rmwOp not in ops:
            return orig_atomic(self, rmwOp, ptr, val, mask, sem, scope)
        # programs run one after another here, so a read-modify-write is atomic; lanes of one
        # call that share an address are applied one by one, in lane order
        np_dtype = itp._get_np_dtype(tt)
        ptrs, values, active = np.broadcast_arrays(ptr.data, val.data, mask.data)
        old = itp._interpreter.load(ptrs, active, np.zeros_like(values, dtype=np_dtype), np_dtype)
        flat_ptr, flat_active = ptrs.reshape(-1), active.reshape(-1)
        if len(np.unique(flat_ptr[flat_active])) == int(flat_active.sum()):
            new = narrow(ops[rmwOp](widen(old, tt), widen(values, tt)), tt).reshape(values.shape)
            itp._interpreter.store(ptrs, new, active)
        else:
            flat_val = values.reshape(-1)
            for i in np.nonzero(flat_active)[0]:
                p = flat_ptr[i:i + 1]
                cur = itp._interpreter.load(p, np.ones(1, bool), np.zeros(1, np_dtype), np_dtype)
                nxt = narrow(ops[rmwOp](widen(cur, tt), widen(flat_val[i:i + 1], tt)), tt)
                itp._interpreter.store(p, nxt, np.ones(1, bool))
        return itp.TensorHandle(old, tt)

    B.create_atomic_rmw = create_atomic_rmw

    R = itp.ReduceOps
    orig_min_max, orig_sum = R.min_max, R.sum

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        inp = input[0] if isinstance(input, tuple) else input
        tt = scalar(inp.dtype)
        if tt not in low:
            return orig_min_max(self, input, val_reduce_op, idx_reduce_op)
        values = widen(inp.handle.data, tt)
        val = idx = None
        if val_reduce_op:
            red = np.asarray(val_reduce_op(values, axis=self.axis, keepdims=self.keep_dims))
            val = self.to_tensor(narrow(red, tt).reshape(red.shape), inp.dtype)
        if idx_reduce_op:
            idx = self.to_tensor(idx_reduce_op(values, axis=self.axis, keepdims=self.keep_dims), tl.int32)
        if val is not None and idx is not None:
            return val, idx
        return val if val is not None else idx

    def reduce_sum(self, input):
        tt = scalar(input.dtype)
        if tt not in low:
            return orig_sum(self, input)
        red = np.asarray(np.sum(widen(input.handle.data, tt), axis=self.axis, keepdims=self.keep_dims))
        return self.to_tensor(narrow(red, tt).reshape(red.shape), input.dtype)

    R.min_max, R.sum = min_max, reduce_sum
    _installed = True
