"""Resolves operator names stored in a program to callable ATen kernels: only the operators of the allow-list
(``edgetorch.formats.operators``) and those the user registered in Python (``register_operator``), each called
only with the instruction kind its schema fits (``check_call_kind``)."""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable
from typing import Any

import torch

from edgetorch.errors import OperatorNotAllowedError, ProgramFormatError
from edgetorch.formats import program as pf
from edgetorch.formats.operators import is_allowed

__all__ = ["operator_key", "register_direct_kernel", "register_operator", "unregister_operator", "is_operator_allowed",
           "resolve_operator",
           "check_call_kind", "direct_kernel", "direct_functional"]

#: Operator namespaces registered by a Python module rather than by torch's C++ core. The module is imported
#: the first time an operator of that namespace is not found, so a process that only runs programs (and never
#: imported the quantization tool-chain) can still execute PT2E Q/DQ ops. Only allowed names are looked up.
_LAZY_NAMESPACES: dict[str, str] = {
    "quantized_decomposed": "torch.ao.quantization.fx._decomposed",  # Q/DQ and choose_qparams (torch itself)
    "torchao": "torchao.quantization.quant_primitives",  # torchao's affine quantize/dequantize ops
}

#: operators the user registered in Python (``register_operator``): "namespace::name.overload" -> overload
_REGISTERED: dict[str, torch._ops.OpOverload] = {}
_REGISTRY_LOCK = threading.Lock()


def operator_key(op: torch._ops.OpOverload) -> str:
    """``torch.ops.aten.addmm.out`` -> ``"aten::addmm.out"`` (the name a program or reference graph stores)."""
    return f"{op.namespace}::{op._schema.name.split('::', 1)[-1]}.{op._overloadname}"


#: never registrable, whoever asks: ops that read or write files, rebind storage or print
_NEVER = ("aten::from_file", "aten::set_", "aten::_print", "aten::save", "aten::load", "debugprims::load_tensor")
_NEVER_NAMESPACES = ("prims", "profiler", "debugprims")


def _check_schema_safe(op: torch._ops.OpOverload) -> None:
    key = operator_key(op)
    if key.rpartition(".")[0] in _NEVER or op.namespace in _NEVER_NAMESPACES:
        raise ValueError(f"operator {key} touches files, storages or the terminal: it cannot be registered")
    for a in op._schema.arguments:
        t = str(a.type)
        if "Storage" in t or "Stream" in t:
            raise ValueError(f"operator {operator_key(op)} takes a {t} ('{a.name}'): it cannot be registered")


def register_operator(op: torch._ops.OpOverload) -> None:
    """Lets programs and ETRecord reference graphs call ``op`` (an ``OpOverload``, e.g. a ``torch.library``
    custom op with its out variant) besides the built-in allow-list. Only Python code registers an operator;
    nothing in a file can. The op runs with the arguments a program gives it: register only kernels that check
    them and touch nothing outside their tensors."""
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(f"register_operator expects a torch OpOverload (torch.ops.ns.name.overload), got "
                        f"{type(op).__name__}")
    _check_schema_safe(op)
    with _REGISTRY_LOCK:
        _REGISTERED[operator_key(op)] = op


def unregister_operator(op: torch._ops.OpOverload) -> None:
    """Undoes ``register_operator`` (a built-in operator stays allowed)."""
    with _REGISTRY_LOCK:
        _REGISTERED.pop(operator_key(op), None)


def is_operator_allowed(name: str, overload: str) -> bool:
    """Whether ``name`` (``"aten::addmm"``) with ``overload`` may run: on the allow-list or registered."""
    return is_allowed(name, overload) or f"{name}.{overload or 'default'}" in _REGISTERED


def _lookup(ns: str, op: str, overload: str) -> torch._ops.OpOverload:
    packet = getattr(getattr(torch.ops, ns), op)
    return getattr(packet, overload or "default")


@functools.cache
def _resolve_allowed(name: str, overload: str) -> torch._ops.OpOverload:
    ns, _, op = name.partition("::")
    try:
        return _lookup(ns, op, overload)
    except (AttributeError, RuntimeError):
        pass
    module = _LAZY_NAMESPACES.get(ns)
    if module is not None:
        try:
            importlib.import_module(module)
            return _lookup(ns, op, overload)
        except (ImportError, AttributeError, RuntimeError):
            pass
    raise ProgramFormatError(
        f"operator {name}.{overload or 'default'} is not available in this runtime", field="operators")


def resolve_operator(name: str, overload: str) -> torch._ops.OpOverload:
    """``("aten::addmm", "out")`` -> ``torch.ops.aten.addmm.out``. A name outside the allow-list
    (``edgetorch.formats.operators``) and not registered raises ``OperatorNotAllowedError`` before any lookup;
    an allowed name this torch lacks raises ``ProgramFormatError``."""
    ns, _, op = name.partition("::")
    if not ns or not op:
        raise ProgramFormatError(f"operator name '{name}' is not of the form namespace::name", field="operators")
    key = f"{name}.{overload or 'default'}"
    registered = _REGISTERED.get(key)
    if registered is not None:
        return registered
    if not is_allowed(name, overload):
        raise OperatorNotAllowedError(
            f"operator {key} is not one the edgetorch runtime runs (not on the allow-list of "
            "edgetorch.formats.operators, not registered with edgetorch.runtime.ops.register_operator)",
            field="operators")
    return _resolve_allowed(name, overload)


def check_call_kind(op: torch._ops.OpOverload, kind: int) -> str | None:
    """Why ``op`` cannot be called as a ``kind`` instruction (``formats.program.CALL_*``), or None. An ``OUT``
    call writes only the schema's out arguments, a ``VIEW`` returns aliases and writes nothing, a
    ``FUNCTIONAL_COPY`` writes nothing."""
    schema = op._schema
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if kind == pf.CALL_OUT:
        if not any(a.is_out for a in schema.arguments):
            return "it has no out arguments"
        bad = [a.name for a in written if not a.is_out]
        return f"it writes its argument(s) {bad}" if bad else None
    if kind == pf.CALL_VIEW:
        if written or not schema.returns or any(r.alias_info is None or r.alias_info.is_write
                                                for r in schema.returns):
            return "it is not a view (its results are not read-only aliases of an input)"
        return None
    if kind == pf.CALL_FUNCTIONAL_COPY:
        return f"it writes its argument(s) {[a.name for a in written]}" if written else None
    return None


# -- direct kernels for autogenerated out variants ------------------------------------------------------------
# Some ``.out`` overloads are generated by torch ("autogen"): they run the functional kernel into a fresh tensor
# and copy it into ``out``. Where torch has a real out kernel computing the same thing with the same code, the
# runtime binds that instead and saves the copy (the program still names the op it was emitted with, so
# debug handles and the tracer are unchanged). Results are bitwise identical (tests/runtime/test_fast_kernels).

_aten = torch.ops.aten
_BN_NO_TRAINING_OUT = _aten._native_batch_norm_legit_no_training.out
_CONVOLUTION_OUT = _aten.convolution.out


def _batch_norm_no_training(pos: list, kw: dict) -> Callable[[], Any] | None:
    """``_native_batch_norm_legit_no_training.out`` -> ``native_batch_norm.out(training=False)``: the autogen
    variant copies; both end in the same CPU batch-norm kernel."""
    x, weight, bias, mean, var, momentum, eps = pos
    out, save_mean, save_invstd = kw["out0"], kw["out1"], kw["out2"]
    if not all(isinstance(t, torch.Tensor) for t in (x, mean, var, out, save_mean, save_invstd)):
        return None
    if save_mean.numel() or save_invstd.numel() or out.shape != x.shape or out.stride() != x.stride():
        return None
    return functools.partial(_aten.native_batch_norm.out._op, x, weight, bias, mean, var, False, momentum, eps,
                             out=out, save_mean=save_mean, save_invstd=save_invstd)


def _convolution(pos: list, kw: dict) -> Callable[[], Any] | None:
    """``convolution.out`` (autogen: convolution then copy) -> ``_slow_conv2d_forward.output`` when torch's own
    backend choice for the call is ``Slow2d`` (which ``at::convolution`` would run into a fresh tensor). The
    choice depends on the thread count (and the oneDNN switch), so it is made per call and cached by both."""
    x, weight, bias, stride, padding, dilation, transposed, output_padding, groups = pos
    out = kw["out"]
    tensors = (x, weight, out) if bias is None else (x, weight, bias, out)
    if (transposed or groups != 1 or not all(isinstance(t, torch.Tensor) for t in tensors) or x.dim() != 4
            or len(stride) != 2 or len(padding) != 2 or any(d != 1 for d in dilation)
            or not all(t.is_contiguous() for t in tensors)):
        return None
    generic = functools.partial(_CONVOLUTION_OUT._op, *pos, **kw)
    direct = functools.partial(_aten._slow_conv2d_forward.output._op, x, weight, list(weight.shape[2:]), bias,
                               list(stride), list(padding), output=out)
    select = functools.partial(torch._C._select_conv_backend, x, weight, bias, list(stride), list(padding),
                               list(dilation), False, list(output_padding), groups)
    slow2d = torch._C._ConvBackend.Slow2d
    chosen: dict[tuple[int, bool], Callable[[], Any]] = {}
    threads, mkldnn_on = torch.get_num_threads, torch._C._get_mkldnn_enabled

    def call() -> Any:
        key = (threads(), mkldnn_on())
        fn = chosen.get(key)
        if fn is None:
            fn = chosen[key] = direct if select() == slow2d else generic
        return fn()
    return call


def _relu(pos: list, kw: dict) -> Callable[[], Any] | None:
    """``relu.out`` (autogen: ``relu`` then copy) -> ``clamp_min.out(x, 0)``, the kernel ``relu`` itself runs."""
    (x,), out = pos, kw["out"]
    if not isinstance(x, torch.Tensor) or x.dtype == torch.bool or x.is_quantized or out.dtype != x.dtype:
        return None
    return functools.partial(torch.clamp_min, x, 0, out=out)


def _clone(pos: list, kw: dict) -> Callable[[], Any] | None:
    """``clone.out`` (autogen: ``clone`` then copy) -> ``out.copy_(x)``: the same element copy, once; none at all
    when the program clones a dying value into itself (``copy_`` of a tensor onto itself returns at once)."""
    (x,), out = pos, kw["out"]
    if not isinstance(x, torch.Tensor) or x.shape != out.shape or x.dtype != out.dtype or x.is_quantized:
        return None
    return functools.partial(out.copy_, x)


def _index_put(pos: list, kw: dict) -> Callable[[], Any] | None:
    """``index_put.out`` writing into its own ``self`` (a KV-cache update the emitter planned in place) ->
    ``self.index_put_(...)``: the autogen out variant clones the whole buffer, puts, then copies it back (two
    full-cache copies per update); in place, only the written slots move. Same result: ``out`` is ``self``."""
    if len(pos) not in (3, 4):
        return None
    x, indices, values, accumulate = (*pos, False)[:4]
    out = kw.get("out")
    if (not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or x.is_quantized
            or x.data_ptr() != out.data_ptr() or x.shape != out.shape or x.stride() != out.stride()
            or x.dtype != out.dtype or "accumulate" in kw):
        return None
    return functools.partial(_aten.index_put_.default, out, list(indices), values, bool(accumulate))


_DIRECT: dict[Any, Callable[[list, dict], Callable[[], Any] | None]] = {
    _BN_NO_TRAINING_OUT: _batch_norm_no_training,
    _CONVOLUTION_OUT: _convolution,
    _aten.relu.out: _relu,
    _aten.clone.out: _clone,
    _aten.index_put.out: _index_put,
}


#: ``torch``'s generated Python bindings of some out overloads: the same ATen kernel through the dispatcher,
#: reached through a compiled argument parser 1-9 us quicker per call than ``OpOverload`` (which parses
#: against the JIT schema at every call). Each takes the overload's arguments in its order, its keyword-only
#: arguments by name and its single ``out``; tests/runtime/test_fast_kernels checks each against the overload.
_NN = torch._C._nn
_PUBLIC: dict[Any, Callable[..., Any]] = {
    _aten.addmm.out: torch.addmm, _aten.mm.out: torch.mm, _aten.bmm.out: torch.bmm,
    _aten.add.out: torch.add, _aten.sub.out: torch.sub, _aten.mul.out: torch.mul, _aten.div.out: torch.div,
    _aten.clamp_min.out: torch.clamp_min, _aten.clamp.out: torch.clamp, _aten._softmax.out: torch._softmax,
    _aten._log_softmax.out: torch._log_softmax, _aten.gelu.out: _NN.gelu, _aten.silu.out: _NN.silu,
    _aten.hardtanh.out: _NN.hardtanh, _aten.sigmoid.out: torch.sigmoid, _aten.tanh.out: torch.tanh,
    _aten.rsqrt.out: torch.rsqrt, _aten.neg.out: torch.neg, _aten.exp.out: torch.exp,
    _aten.mean.out: torch.mean, _aten.sum.IntList_out: torch.sum, _aten.amax.out: torch.amax,
    _aten.argmax.out: torch.argmax, _aten.cumsum.out: torch.cumsum, _aten.gt.Scalar_out: torch.gt,
    _aten.eq.Tensor_out: torch.eq, _aten.logical_or.out: torch.logical_or, _aten.bitwise_not.out: torch.bitwise_not,
    _aten.where.self_out: torch.where, _aten.pow.Tensor_Scalar_out: torch.pow,
}


def _public(op: torch._ops.OpOverload, pos: list, kw: dict) -> Callable[[], Any] | None:
    fn = _PUBLIC.get(op)
    outs = [a.name for a in op._schema.arguments if a.is_out]
    if fn is None or outs != ["out"] or not isinstance(kw.get("out"), torch.Tensor):
        return None
    return functools.partial(fn, *pos, **kw)


def register_direct_kernel(op: torch._ops.OpOverload, make: Callable[[list, dict], Callable[[], Any] | None]) -> None:
    """Binds ``op``'s calls to ``make(pos, kw)`` (a call computing the op itself, or None to keep ``op``): for the
    runtime's own kernels written in Python, whose dispatch through torch costs more than their work."""
    _DIRECT[op] = make


def direct_kernel(op: torch._ops.OpOverload, pos: list, kw: dict) -> Callable[[], Any] | None:
    """A quicker call computing ``op(*pos, **kw)`` (a real out kernel in place of an autogen variant's compute
    and copy, or torch's Python binding of the same overload), or None: the caller binds ``op`` itself."""
    make = _DIRECT.get(op)
    call = make(pos, kw) if make is not None else None
    return call if call is not None else _public(op, pos, kw)


# -- functional ops that are a fill or a copy ---------------------------------------------------------------
# ``_to_copy`` is ``empty`` + ``copy_``, ``full_like``/``scalar_tensor`` are ``empty`` + ``fill_``: with no out
# overload of the same arguments they are emitted as FUNCTIONAL_COPY (compute, then copy into the planned slot).
# Writing the slot directly with ``copy_``/``fill_`` converts each element the same way and skips the temporary.


def _cpu_strided(kw: dict) -> bool:
    device = kw.get("device")
    return (kw.get("layout") in (None, torch.strided) and not kw.get("pin_memory")
            and (device is None or torch.device(device).type == "cpu"))


def _to_copy(pos: list, kw: dict, dst: torch.Tensor) -> Callable[[], Any] | None:
    (src,) = pos
    dtype = kw.get("dtype")
    if (not isinstance(src, torch.Tensor) or not _cpu_strided(kw) or src.shape != dst.shape or src.is_quantized
            or dst.dtype != (dtype or src.dtype) or src.layout != torch.strided):
        return None
    return functools.partial(dst.copy_, src)


def _fill(value: Any, kw: dict, dst: torch.Tensor) -> Callable[[], Any] | None:
    dtype = kw.get("dtype")
    if not _cpu_strided(kw) or (dtype is not None and dst.dtype != dtype) or isinstance(value, torch.Tensor):
        return None
    return functools.partial(dst.fill_, value)


def _full_like(pos: list, kw: dict, dst: torch.Tensor) -> Callable[[], Any] | None:
    src, value = pos
    if not isinstance(src, torch.Tensor) or src.shape != dst.shape or (kw.get("dtype") is None
                                                                      and src.dtype != dst.dtype):
        return None
    return _fill(value, kw, dst)


def _scalar_tensor(pos: list, kw: dict, dst: torch.Tensor) -> Callable[[], Any] | None:
    return _fill(pos[0], kw, dst) if dst.dim() == 0 and kw.get("dtype") is not None else None


_DIRECT_FUNCTIONAL: dict[Any, Callable[[list, dict, torch.Tensor], Callable[[], Any] | None]] = {
    _aten._to_copy.default: _to_copy,
    _aten.full_like.default: _full_like,
    _aten.scalar_tensor.default: _scalar_tensor,
}


# -- PT2E's per-tensor quantize / dequantize ---------------------------------------------------------------------
# ``quantized_decomposed`` implements them in Python, one temporary per step (quantize: five). The same steps in
# the same order, in place on one temporary (quantize) or on the planned slot (dequantize), give bitwise the same
# values (tests/runtime/test_fast_kernels).


def _scalars(scale: Any, zero_point: Any) -> bool:
    return isinstance(scale, (int, float)) and not isinstance(scale, bool) and isinstance(zero_point, int)


def _quantize_per_tensor(pos: list, kw: dict, dst: torch.Tensor) -> Callable[[], Any] | None:
    """``clamp(round(x * (1 / scale)) + zero_point, qmin, qmax).to(dtype)``."""
    x, scale, zero_point, qmin, qmax, dtype = pos
    if (kw or not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or dst.dtype != dtype
            or x.shape != dst.shape or not _scalars(scale, zero_point) or scale == 0):
        return None
    inv_scale = 1.0 / scale

    def quantize(x=x, inv_scale=inv_scale, zero_point=zero_point, qmin=qmin, qmax=qmax, dst=dst):
        t = torch.mul(x, inv_scale)
        t.round_().add_(zero_point).clamp_(qmin, qmax)
        dst.copy_(t)
    return quantize


def _dequantize_per_tensor(pos: list, kw: dict, dst: torch.Tensor) -> Callable[[], Any] | None:
    """``(x.to(out_dtype) - zero_point) * scale``, written into the planned slot."""
    x, scale, zero_point, _, _, dtype = pos
    out_dtype = kw.get("out_dtype") or torch.float32
    if (set(kw) - {"out_dtype"} or not isinstance(x, torch.Tensor) or x.dtype != dtype or dst.dtype != out_dtype
            or x.shape != dst.shape or not _scalars(scale, zero_point)):
        return None

    def dequantize(x=x, scale=scale, zero_point=zero_point, dst=dst):
        dst.copy_(x)
        dst.sub_(zero_point).mul_(scale)
    return dequantize


_DIRECT_QDQ = {("quantized_decomposed::quantize_per_tensor", "default"): _quantize_per_tensor,
               ("quantized_decomposed::dequantize_per_tensor", "default"): _dequantize_per_tensor}


def direct_functional(op: torch._ops.OpOverload, pos: list, kw: dict, dst: torch.Tensor) -> Callable[[], Any] | None:
    """A call writing ``op(*pos, **kw)`` straight into ``dst`` (no temporary), or None."""
    make = _DIRECT_FUNCTIONAL.get(op) or _DIRECT_QDQ.get((op._schema.name, op._overloadname))
    return make(pos, kw, dst) if make is not None else None
