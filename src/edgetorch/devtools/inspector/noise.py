"""Scale-aware gaps: relative errors and the rounding noise an op is expected to make in its dtype.

Relative error. ``rel_error(ref, rt) = ||rt - ref||_2 / max(||ref||_2, tiny)`` (float64 sums; equal elements,
same-signed infinities included, differ by 0; ``tiny`` is the dtype's smallest normal number, so an all-zero
reference does not divide by zero). It is None for integer and bool rows, which are compared exactly.

Noise model (``noise_floor``). An op evaluated in a floating dtype with unit roundoff ``u`` (``eps / 2``:
2**-24 for float32, 2**-11 for float16, 2**-8 for bfloat16) makes a relative error of order ``u`` per rounding;
a reduction over ``K`` terms (a dot product of a matmul or convolution, a softmax or normalisation over ``K``
elements) accumulates ``K`` roundings whose errors add like a random walk, relative ``~ u * sqrt(K)`` of the
result (Higham, *Accuracy and Stability of Numerical Algorithms*, section 4.2 / 3.5 probabilistic bounds). Two
implementations that round differently (another summation order, blocking, FMA, a polynomial ``exp``/``erf``)
differ by about the sum of both errors. The floor of one op is therefore::

    floor(op) = u * (C_ELEMENT + C_REDUCE * sqrt(K) + C_TRANSCENDENTAL * [op is transcendental])

and a row adds the floors of the ops the runtime computed since the values it logged (a delegate node fusing
``linear`` + ``gelu``, a ``DELEGATE_CALL`` whose inner ops are not logged), along the longest such chain.
Ops that only move elements (views, ``cat``, ``relu``, max-pooling) make no rounding error. A row
computed by a delegate (an ORT node or a ``DELEGATE_CALL``) is multiplied by ``DELEGATE_FACTOR``: the backend
reassociates sums, fuses ops and uses its own transcendental approximations, so its error is allowed to be
larger than ATen's own. Portable rows run the same ATen kernels as the reference and are usually bit-identical.
The constants are calibrated on clean FP32 programs (zoo and Hugging Face models, portable and ORT:
``bench/bench_culprits.py --clean-only`` prints, per program, the largest ratio ``local_rel_error / noise_floor``
seen) with a margin, and are documented in ``df.attrs["noise_model"]``.

Integer kernels (``quant_step``). In a quantized program a backend may run ``dequantize -> op -> quantize`` as
one integer kernel (ORT's QLinearConv / QGemm / MatMulInteger): it accumulates in int32 and requantizes with its
own rounding, so a value can land one step of its quantization grid away from the fake-quant reference's (a
tie rounded the other way, a bias rounded to the accumulator's scale). That step is noise, not a fault: a row
whose value lies on a grid, or feeds one, adds ``step * sqrt(N) / ||ref||`` to its floor (every one of its ``N``
elements one step away), where ``step`` is the dequantize's scale (the op is a dequantize), the accumulator's
step ``s_input * s_weight`` (a matmul/convolution of dequantized operands: the largest channel scale), else
the scale of the quantize every reader applies. An integer row that a quantize produced is noise when no
element differs by more than one step. Planted faults (a weight or scale perturbed) move values by many steps.

Verdict (on the local error, the error the op adds itself): ``"exact"`` when the runtime value equals the local
reference (integer/bool rows with no mismatching element, float rows with ``local_rel_error == 0``), ``"noise"``
when ``local_rel_error <= noise_floor``, ``"real"`` otherwise (integer/bool rows: any mismatching element).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

__all__ = ["C_ELEMENT", "C_REDUCE", "C_TRANSCENDENTAL", "DELEGATE_FACTOR", "VERDICTS", "unit_roundoff", "rel_error",
           "quant_step", "step_floor", "op_noise", "floor_from_units", "verdict", "noise_model_attrs"]

#: per rounding of an element-wise result (the op's own output rounding, both sides)
C_ELEMENT = 2.0
#: per sqrt(K) of a K-term reduction (random-walk accumulation, both sides, with margin)
C_REDUCE = 1.0
#: allowance of a few ulps for a transcendental's approximation (exp, erf, tanh, ...)
C_TRANSCENDENTAL = 8.0
#: delegate rows: the backend reassociates, fuses and approximates
DELEGATE_FACTOR = 3.0

VERDICTS = ("exact", "noise", "real")

_TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sigmoid", "erf", "erfc", "gelu", "silu",
    "softmax", "_softmax", "log_softmax", "_log_softmax", "pow", "sqrt", "rsqrt", "sin", "cos", "tan", "atan",
    "asin", "acos", "sinh", "cosh", "mish", "elu", "selu", "softplus", "hardswish", "hardsigmoid", "reciprocal",
    "div", "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu", "native_layer_norm",
    "layer_norm", "native_group_norm", "group_norm", "rms_norm", "var", "var_mean", "std", "batch_norm",
    "native_batch_norm", "_native_batch_norm_legit_no_training", "_native_batch_norm_legit",
}
_MATMUL = {"mm", "bmm", "matmul", "addmm", "baddbmm", "linear", "addmv", "mv", "dot", "einsum"}
_CONV = {"convolution", "conv1d", "conv2d", "conv3d", "_convolution", "conv_transpose1d", "conv_transpose2d"}
_NORM_LAST = {"layer_norm", "native_layer_norm", "rms_norm", "softmax", "_softmax", "log_softmax",
              "_log_softmax"}
#: ops that move or select elements without rounding them
_NO_ROUNDING = {
    "view", "_unsafe_view", "reshape", "permute", "expand", "cat", "clone", "select", "slice", "getitem",
    "transpose", "t", "unsqueeze", "squeeze", "unbind", "split", "split_with_sizes", "chunk", "contiguous",
    "alias", "flatten", "detach", "dropout", "stack", "index_select", "gather", "embedding", "relu", "max_pool2d",
    "max_pool2d_with_indices", "pad", "constant_pad_nd", "index", "narrow", "expand_copy", "view_copy",
    "permute_copy", "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy", "transpose_copy", "neg",
    "abs", "where", "masked_fill", "maximum", "minimum", "clamp", "hardtanh", "amax", "amin", "max", "min",
    "lift_fresh_copy", "_to_copy", "copy", "copy_", "zeros_like", "ones_like", "full", "full_like", "arange",
}
_POOL = {"adaptive_avg_pool2d", "_adaptive_avg_pool2d", "avg_pool2d", "adaptive_avg_pool1d", "avg_pool1d"}
_REDUCE_DIMS = {"sum", "mean", "var", "std", "var_mean", "amax", "amin", "norm", "linalg_vector_norm", "prod",
                "cumsum", "logsumexp"}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of a floating dtype (0.0 for integer and bool dtypes)."""
    if not dtype.is_floating_point:
        return 0.0
    return torch.finfo(dtype).eps / 2.0


def rel_error(ref: torch.Tensor, rt: torch.Tensor, equal: bool | None = None) -> float | None:
    """``||rt - ref||_2 / max(||ref||_2, tiny)`` in float64 (equal elements, equal infinities too, count 0);
    None for integer/bool tensors. ``equal``: whether both are bit-identical (same dtype and values), when the
    caller knows it (spares a comparison pass)."""
    if not ref.dtype.is_floating_point:
        return None
    a, b = ref.detach().reshape(-1), rt.detach().reshape(-1)
    if equal is not None and a.dtype != b.dtype:
        equal = False
    if not a.numel() or (a.dtype == b.dtype and (torch.equal(a, b) if equal is None else equal)):
        return 0.0
    a = a.double()
    d = a - b  # b is promoted element by element: the difference is exact in float64
    num = torch.linalg.vector_norm(d).item()
    if not math.isfinite(num):  # inf - inf is nan: count equal elements as 0 (a slower pass, only here)
        num = torch.linalg.vector_norm(torch.where(a == b, torch.zeros((), dtype=torch.float64), d)).item()
    if num == 0.0:
        return 0.0
    den = max(torch.linalg.vector_norm(a).item(), torch.finfo(ref.dtype).tiny)
    return num / den if math.isfinite(num) else math.inf


def _name(node: torch.fx.Node) -> str:
    t = node.target
    name = getattr(t, "__name__", str(t))
    name = name.split(".")[0]
    return name.removeprefix("aten::")


def _shape(x: Any) -> tuple[int, ...] | None:
    v = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
    if isinstance(v, (list, tuple)):
        v = v[0] if v else None
    shape = getattr(v, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(s) for s in shape)
    except (TypeError, ValueError):  # symbolic sizes: use their hint
        return tuple(int(getattr(s, "node", s).hint) if hasattr(s, "node") else 1 for s in shape)


def _reduce_len(node: torch.fx.Node, args: tuple | None = None) -> int:
    """The number of terms of the op's largest reduction (1 for element-wise ops); shapes come from ``args``
    (the op's actual arguments) or, without them, from the nodes' ``val`` metadata."""
    name = _name(node)
    args = node.args if args is None else args
    first = _shape(args[0]) if args else None
    if name in _MATMUL:
        src = args[1] if name in ("addmm", "baddbmm", "addmv") and len(args) > 1 else (args[0] if args else None)
        s = _shape(src)
        return s[-1] if s else 1
    if name in _CONV:
        w = _shape(args[1]) if len(args) > 1 else None
        return int(math.prod(w[1:])) if w else 1
    if name.startswith("scaled_dot_product") or "attention" in name:
        return (first[-1] + _shape(args[1])[-2]) if first and len(args) > 1 and _shape(args[1]) else 1
    if name in _NORM_LAST:
        return first[-1] if first else 1
    if name in ("native_group_norm", "group_norm", "native_batch_norm", "_native_batch_norm_legit_no_training"):
        return int(math.prod(first[1:])) if first else 1
    if name in _POOL and first:
        return int(math.prod(first[2:])) or 1
    if name in _REDUCE_DIMS and first:
        dims = args[1] if len(args) > 1 else None
        if isinstance(dims, int):
            dims = [dims]
        if not dims:
            return int(math.prod(first)) or 1
        return int(math.prod(first[d] for d in dims if -len(first) <= d < len(first))) or 1
    return 1


def op_noise(node: torch.fx.Node, u: float, args: tuple | None = None) -> float:
    """The expected relative rounding error of one op (see the module docstring); ``args``: its actual
    arguments (shapes), else the nodes' metadata."""
    if node.op != "call_function":
        return 0.0
    name = _name(node)
    if name in _NO_ROUNDING:
        return 0.0
    k = _reduce_len(node, args)
    floor = C_ELEMENT + (C_REDUCE * math.sqrt(k) if k > 1 else 0.0)
    if name in _TRANSCENDENTAL:
        floor += C_TRANSCENDENTAL
    return u * floor


def floor_from_units(units: float, dtype: torch.dtype, delegated: bool) -> float | None:
    """The noise floor of a row whose local comparison re-runs ops worth ``units`` (``op_noise`` at u=1, summed
    along the ops the runtime computed since the values it logged), in ``dtype``; None for integer/bool rows."""
    u = unit_roundoff(dtype)
    if not u:
        return None
    return u * max(units, C_ELEMENT) * (DELEGATE_FACTOR if delegated else 1.0)


def verdict(local_rel: float | None, floor: float | None, exact_row: bool, local_gap: float | None,
            accumulated_rel: float | None = None) -> str:
    """``"exact"``, ``"noise"`` or ``"real"`` for one row (see the module docstring). Without a local error,
    the accumulated one is judged."""
    if exact_row:
        return "exact" if not local_gap else "real"
    err = local_rel if local_rel is not None else accumulated_rel
    if err is None or err == 0.0:
        return "exact"
    if floor is not None and err <= floor:
        return "noise"
    return "real"


def _scalar(node: Any) -> float | None:
    """A scale argument's largest value: a number, or a constant tensor a ``get_attr`` node holds."""
    if isinstance(node, (int, float)):
        return float(node)
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        obj: Any = node.graph.owning_module
        for part in str(node.target).split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, torch.Tensor) and obj.numel():
            return float(obj.detach().abs().max())
    return None


def _q_name(node: Any) -> str:
    return _name(node) if isinstance(node, torch.fx.Node) and node.op == "call_function" else ""


def quant_step(node: torch.fx.Node | None) -> float | None:
    """The quantization step an integer kernel may round the value of ``node`` by (see the module docstring);
    None when the value is on no grid. A quantize's own (integer) output: 1.0, one integer step."""
    if node is None or node.op != "call_function":
        return None
    name = _name(node)
    if name.startswith("quantize_per_"):
        return 1.0
    if name.startswith("dequantize_per_"):
        return _scalar(node.args[1]) if len(node.args) > 1 else None
    if name in _MATMUL or name in _CONV:
        scales = [_scalar(a.args[1]) if _q_name(a).startswith("dequantize_per_") and len(a.args) > 1 else None
                  for a in node.args[:2]]
        if len(scales) == 2 and None not in scales:
            return scales[0] * scales[1]
    readers = [_scalar(r.args[1]) for r in node.users if _q_name(r).startswith("quantize_per_") and len(r.args) > 1]
    if readers and len(readers) == len(node.users) and None not in readers:
        return max(readers)
    return None


def step_floor(step: float | None, ref: torch.Tensor, rt: torch.Tensor) -> tuple[float, bool]:
    """The integer-kernel allowance of a row whose values lie on a grid of ``step``: the relative floor term
    ``step * sqrt(N) / ||ref||`` (float rows), and whether an integer row is within one step (no element of
    ``rt`` more than one step from ``ref``)."""
    if not step or ref.numel() == 0 or ref.shape != rt.shape:
        return 0.0, False
    if not ref.dtype.is_floating_point:
        return 0.0, bool((ref.long() - rt.long()).abs().max().item() <= 1)
    den = max(torch.linalg.vector_norm(ref.double()).item(), torch.finfo(ref.dtype).tiny)
    return step * math.sqrt(ref.numel()) / den, False


def noise_model_attrs() -> dict[str, Any]:
    """What ``df.attrs["noise_model"]`` holds: the formula and its constants."""
    return {
        "formula": "u * sum_ops(C_ELEMENT + C_REDUCE*sqrt(K) + C_TRANSCENDENTAL*[transcendental])"
                   " * (DELEGATE_FACTOR if computed by a delegate)",
        "u": "unit roundoff of the row's dtype (eps/2)",
        "K": "reduction length of the op (matmul inner dim, conv Cin/groups*kh*kw, normalised/softmax dim)",
        "C_ELEMENT": C_ELEMENT, "C_REDUCE": C_REDUCE, "C_TRANSCENDENTAL": C_TRANSCENDENTAL,
        "DELEGATE_FACTOR": DELEGATE_FACTOR,
        "integer_kernels": "+ step*sqrt(N)/||ref|| where the value lies on (or feeds) a quantization grid of step "
                           "'step'; an integer row from a quantize: noise when within one step",
        "verdict": "exact: local error 0 (exact rows: no mismatch); noise: local_rel_error <= noise_floor; "
                   "real: above it",
    }
