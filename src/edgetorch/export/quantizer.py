"""A small symmetric INT8 PT2E quantizer of our own, written on torchao's public quantizer API.

Weights are int8 in [-127, 127], symmetric (per output channel or per tensor); activations are int8 in
[-128, 127], affine per tensor, observed statically during calibration or computed at run time (dynamic).
Patterns annotated: ``conv1d/conv2d``, ``linear`` and ``addmm`` with a constant weight (Hugging Face's ``Conv1D``,
GPT-2's projections; its ``(in, out)`` weight quantized per column when per channel), each optionally followed by
``relu``/``hardtanh``, which are then fused: only the activation's output is quantized), and for static modes
also ``add`` (+ ``relu``) and ``max_pool2d`` / ``avg_pool2d`` / ``adaptive_avg_pool2d`` (output shares the input's
parameters).
Everything else stays in float; biases stay float.

Bias correction (``bias_correction=True``, the default for static quantization; Nagel et al. 2019, "Data-Free
Quantization", section 4.2, measured on the calibration samples): the int8 weight of a conv/linear shifts the
mean of its output by ``E[op(x, W_int8 - W)]``; :func:`convert_calibrated` subtracts that mean (per output
channel, over the calibration samples with the float model's inputs) from the op's float bias. It removes the
systematic part of each layer's weight error and leaves the layers kept float untouched.

Exclusions keep chosen ops in float (TFLite's denylist, the selective fallback of quantization debugging):
``exclude_module_paths`` (substrings of ``nn_module_stack`` paths, as ``OrtPartitioner``'s), ``exclude_nodes``
(node names of the pre-quantization ATen graph, e.g. ``"conv2d_1"``, as the float reference graph of the
ETRecord names them) and ``exclude_ops`` (OpOverloads or names such as ``"aten.linear.default"`` / ``"linear"``).
An excluded op is left unannotated: its inputs, weights and output stay float (a quantized producer's output is
dequantized before it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import (
    HistogramObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
    generate_numeric_debug_handle,
)
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

from edgetorch.errors import RecipeError
from edgetorch.exir.quant_annotations import (
    ADD_OPS,
    ANNOTATED_OPS,
    FUSED_ACTIVATION_OPS,
    MATMUL_WEIGHTED_OPS,
    POOL_OPS,
    WEIGHTED_OPS,
    data_arg,
    float_handle,
    float_handles_as_debug_handles,
    module_paths,
    weight_arg,
    weight_channel_axis,
)
from edgetorch.export._capture import export_method

__all__ = ["ANNOTATED_OPS", "FUSED_ACTIVATION_OPS", "WEIGHTED_OPS", "SymmetricQuantizationConfig",
           "SymmetricInt8Quantizer", "capture_float_program", "convert_calibrated", "correct_biases", "float_handle",
           "float_handles_as_debug_handles", "get_symmetric_quantization_config", "module_paths",
           "resolve_op"]

_ANNOTATION_KEY = "quantization_annotation"  # the node.meta key prepare_pt2e reads
_EPS = 2.0 ** -12

aten = torch.ops.aten
# the annotation tables (ANNOTATED_OPS, WEIGHTED_OPS, ...) live in edgetorch.exir.quant_annotations: the developer
# tools read them too


@dataclass(frozen=True)
class SymmetricQuantizationConfig:
    """How to quantize: weight granularity, static or dynamic activations, and the activation observer.

    ``per_channel``: one weight scale per output channel (else one per tensor).
    ``dynamic``: activations of conv/linear are quantized at run time from their own min/max
    (``choose_qparams``); only conv/linear are annotated then.
    ``activation_observer``: "minmax" (fast, the default) or "histogram" (slower calibration, clips outliers).
    ``bias_correction``: static quantization corrects each conv/linear bias for the mean output shift of its
    weight quantization (see the module docstring and :func:`convert_calibrated`); ignored when ``dynamic``.
    ``exclude_module_paths`` / ``exclude_nodes`` / ``exclude_ops``: ops kept in float; ``exclude_activations``:
    values kept float (see the module docstring); bad values raise ``RecipeError`` naming the argument.
    """

    per_channel: bool = True
    dynamic: bool = False
    activation_observer: Literal["minmax", "histogram"] = "minmax"
    exclude_module_paths: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    exclude_ops: tuple[object, ...] = ()
    exclude_activations: tuple[str, ...] = ()
    bias_correction: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.bias_correction, bool):
            raise RecipeError(f"bias_correction must be True or False, got {self.bias_correction!r}")
        if self.activation_observer not in ("minmax", "histogram"):
            raise RecipeError(f"activation_observer must be 'minmax' or 'histogram', got "
                              f"{self.activation_observer!r}")
        object.__setattr__(self, "exclude_module_paths", _strings(self.exclude_module_paths, "exclude_module_paths"))
        object.__setattr__(self, "exclude_nodes", _strings(self.exclude_nodes, "exclude_nodes"))
        object.__setattr__(self, "exclude_activations", _strings(self.exclude_activations, "exclude_activations"))
        object.__setattr__(self, "exclude_ops", tuple(resolve_op(o, "exclude_ops") for o in _items(
            self.exclude_ops, "exclude_ops")))

    def excludes(self, node: Node) -> str | None:
        """Why ``node`` stays float (``"exclude_nodes"``, ...), or None when it may be quantized."""
        if node.name in self.exclude_nodes:
            return "exclude_nodes"
        if node.target in self.exclude_ops:
            return "exclude_ops"
        if self.exclude_module_paths:
            paths = module_paths(node)
            if any(sub in p for sub in self.exclude_module_paths for p in paths):
                return "exclude_module_paths"
        return None

    def activation_spec(self) -> QuantizationSpec:
        if self.dynamic:
            ctr = PlaceholderObserver.with_args(eps=_EPS)
        elif self.activation_observer == "histogram":
            ctr = HistogramObserver.with_args(eps=_EPS)
        else:
            ctr = MinMaxObserver.with_args(eps=_EPS)
        return QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine,
                                is_dynamic=self.dynamic, observer_or_fake_quant_ctr=ctr)

    def weight_spec(self, ch_axis: int = 0) -> QuantizationSpec:
        """The weight's spec; ``ch_axis``: its output-channel axis (per channel)."""
        if self.per_channel:
            return QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127,
                                    qscheme=torch.per_channel_symmetric, ch_axis=ch_axis,
                                    observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=_EPS))
        return QuantizationSpec(dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_tensor_symmetric,
                                observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=_EPS))


def get_symmetric_quantization_config(per_channel: bool = True, dynamic: bool = False,
                                      activation_observer: Literal["minmax", "histogram"] = "minmax",
                                      exclude_module_paths: Iterable[str] = (), exclude_nodes: Iterable[str] = (),
                                      exclude_ops: Iterable[object] = (), exclude_activations: Iterable[str] = (),
                                      bias_correction: bool = True) -> SymmetricQuantizationConfig:
    """The config of :class:`SymmetricInt8Quantizer` (a named constructor, as users of PT2E expect)."""
    return SymmetricQuantizationConfig(per_channel, dynamic, activation_observer, tuple(exclude_module_paths),
                                       tuple(exclude_nodes), tuple(exclude_ops), tuple(exclude_activations),
                                       bias_correction)


def _items(value: object, arg: str) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise RecipeError(f"{arg} must be a list or tuple, got {type(value).__name__} {value!r}")
    return tuple(value)


def _strings(value: object, arg: str) -> tuple[str, ...]:
    items = _items(value, arg)
    bad = [v for v in items if not isinstance(v, str) or not v]
    if bad:
        raise RecipeError(f"{arg} must hold non-empty strings, got {bad!r}")
    return items


def resolve_op(spec: object, arg: str = "exclude_ops") -> torch._ops.OpOverload:
    """An OpOverload from an OpOverload, a packet (its default overload) or a name (``"aten.linear.default"``,
    ``"linear"``, ``"add.Tensor"``); anything else raises ``RecipeError`` naming ``arg``."""
    if isinstance(spec, torch._ops.OpOverload):
        return spec
    if isinstance(spec, torch._ops.OpOverloadPacket):
        return spec.default
    if not isinstance(spec, str) or not spec:
        raise RecipeError(f"{arg}: expected an op (OpOverload or a name such as 'aten.linear.default'), got "
                          f"{type(spec).__name__} {spec!r}")
    parts = spec.split(".")
    if parts[0] == "aten":
        parts = parts[1:]
    name, overload = parts[0], (parts[1] if len(parts) > 1 else "default")
    try:
        return getattr(getattr(aten, name), overload)
    except (AttributeError, RuntimeError, IndexError):
        raise RecipeError(f"{arg}: unknown op {spec!r} (expected e.g. 'aten.linear.default' or 'linear')") from None


def capture_float_program(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                          dynamic_shapes: object = None, strict: bool = False) -> ExportedProgram:
    """``torch.export`` of the float model with torchao's PT2E numeric debug handles on every op node: quantize
    ``capture_float_program(...).module()`` with ``prepare_pt2e``/``convert_pt2e`` and the handles survive into
    the quantized program (``meta["custom"]["numeric_debug_handle"]``, kept by re-export and ``to_edge``), so
    every quantized op group maps back to its float op. Record the program with
    ``etrecord.add_float_reference(program)`` (export sessions with a quantization recipe do both)."""
    ep = export_method(model, tuple(args), kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    generate_numeric_debug_handle(ep)
    return ep


def _is_float_tensor(n: object) -> bool:
    if not isinstance(n, Node):
        return False
    v = n.meta.get("val")
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _is_annotated(n: Node) -> bool:
    ann = n.meta.get(_ANNOTATION_KEY)
    return ann is not None and ann._annotated


def _fused_activation(n: Node, config: SymmetricQuantizationConfig) -> Node | None:
    """The relu/hardtanh that is ``n``'s only user, if any, not annotated yet and not excluded."""
    if len(n.users) != 1:
        return None
    (user,) = n.users
    if user.op == "call_function" and user.target in FUSED_ACTIVATION_OPS and not _is_annotated(user) \
            and not config.excludes(user):
        return user
    return None


def _keep_values_float(model: GraphModule, names: tuple[str, ...]) -> None:
    """The outputs of the nodes named in ``names`` quantized neither by their producer nor as an input of their
    consumers (a pool whose output shares such an input's parameters keeps its output float too)."""
    if not names:
        return
    for n in model.graph.nodes:
        if n.name not in names:
            continue
        ann = n.meta.get(_ANNOTATION_KEY)
        if ann is not None:
            ann.output_qspec = None
        for u in n.users:
            ua = u.meta.get(_ANNOTATION_KEY)
            if ua is None or n not in ua.input_qspec_map:
                continue
            del ua.input_qspec_map[n]
            if isinstance(ua.output_qspec, SharedQuantizationSpec) and ua.output_qspec.edge_or_node == (n, u):
                ua.output_qspec = None


def _annotate(n: Node, inputs: dict, output: object = None) -> None:
    n.meta[_ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=output, _annotated=True)


def _annotate_with_activation(n: Node, inputs: dict, act: QuantizationSpec,
                              config: SymmetricQuantizationConfig) -> None:
    """Annotates ``n``'s inputs; its output is quantized, or, when a relu/hardtanh follows and is fused, the
    activation's output instead."""
    relu = _fused_activation(n, config)
    if relu is None:
        _annotate(n, inputs, act)
    else:
        _annotate(n, inputs)
        _annotate(relu, {}, act)


class SymmetricInt8Quantizer(Quantizer):
    """PT2E quantizer: ``prepare_pt2e(torch.export.export(m, args).module(), SymmetricInt8Quantizer(config))``.

    See the module docstring for what is annotated. ``set_global(config)`` replaces the config (kept for
    familiarity with other PT2E quantizers) and returns the quantizer.
    """

    def __init__(self, config: SymmetricQuantizationConfig | None = None) -> None:
        super().__init__()
        self.config = config or SymmetricQuantizationConfig()

    def set_global(self, config: SymmetricQuantizationConfig) -> SymmetricInt8Quantizer:
        self.config = config
        return self

    def annotate(self, model: GraphModule) -> GraphModule:
        cfg = self.config
        act, weight = cfg.activation_spec(), cfg.weight_spec()
        nodes = [n for n in model.graph.nodes if n.op == "call_function" and not cfg.excludes(n)]
        for n in nodes:
            if n.target in WEIGHTED_OPS | MATMUL_WEIGHTED_OPS and not _is_annotated(n):
                self._annotate_weighted(n, act, weight if n.target in WEIGHTED_OPS else
                                        cfg.weight_spec(weight_channel_axis(n)))
        if cfg.dynamic:
            return model
        for n in nodes:
            if n.target in ADD_OPS and not _is_annotated(n):
                self._annotate_add(n, act)
        for n in nodes:
            if n.target in POOL_OPS and not _is_annotated(n):
                x = n.args[0]
                if _is_float_tensor(x):
                    _annotate(n, {x: act}, SharedQuantizationSpec((x, n)))
        _keep_values_float(model, cfg.exclude_activations)
        return model

    def _annotate_weighted(self, n: Node, act: QuantizationSpec, weight: QuantizationSpec) -> None:
        wi = weight_arg(n)
        if wi is None or len(n.args) <= wi:
            return
        x, w = n.args[data_arg(n)], n.args[wi]
        if not (_is_float_tensor(x) and _is_float_tensor(w)):
            return
        if n.target in MATMUL_WEIGHTED_OPS and (w.op != "get_attr" or n.kwargs):  # a product of two activations,
            return  # or a scaled addmm (beta/alpha): left float
        inputs: dict = {x: act, w: weight}
        if self.config.dynamic:  # dynamic: quantize the input at run time, keep the output float
            _annotate(n, inputs)
            return
        _annotate_with_activation(n, inputs, act, self.config)

    def _annotate_add(self, n: Node, act: QuantizationSpec) -> None:
        inputs = {a: act for a in n.args[:2] if _is_float_tensor(a)}
        if not inputs or not _is_float_tensor(n):
            return
        _annotate_with_activation(n, inputs, act, self.config)

    def validate(self, model: GraphModule) -> None:
        """Nothing to check: every annotation this quantizer makes is one the portable kernels run."""


# ---------------------------------------------------------------------------------------------------------------
# bias correction
_BIAS_CORRECTIONS_KEY = "edgetorch_bias_corrections"


def _is_qdq(n: Node) -> bool:
    return n.op == "call_function" and "quantize_per" in str(n.target)


def _weight_qdq(op: Node) -> tuple[Node, Node] | None:
    """``(quantize, dequantize)`` of ``op``'s weight when it reads ``dequantize(quantize(get_attr))`` (a
    ``convert_pt2e(..., fold_quantize=False)`` module), else None."""
    wi = weight_arg(op)
    dq = op.args[wi] if wi is not None and len(op.args) > wi else None
    if not isinstance(dq, Node) or not _is_qdq(dq) or "dequantize" not in str(dq.target) or not dq.args:
        return None
    q = dq.args[0]
    if not isinstance(q, Node) or not _is_qdq(q) or not isinstance(q.args[0], Node) or q.args[0].op != "get_attr":
        return None
    return q, dq


def correct_biases(gm: GraphModule, samples: Iterable[tuple]) -> dict[str, str | None]:
    """Bias correction of a ``convert_pt2e(prepared, fold_quantize=False)`` module, in place: for every
    conv/linear whose weight is quantized, ``delta = mean(op(x, W_int8 - W))`` per output channel over the
    ``samples`` (``x``: the op's input in the float model, i.e. the module run with every quantize/dequantize
    skipped) is subtracted from the op's bias (a new buffer ``_bias_corrected_<i>``; an op without bias gets
    one). Returns ``{op name: the name of the bias node it read, or None}`` (also
    ``gm.meta["edgetorch_bias_corrections"]``), so a caller that takes the op's weight quantizer out again can
    restore its bias."""
    from torch.fx.interpreter import Interpreter

    targets = {op: qdq for op in gm.graph.nodes if op.op == "call_function" and op.target in
               WEIGHTED_OPS | MATMUL_WEIGHTED_OPS and (qdq := _weight_qdq(op)) is not None}
    def const(a: object) -> object:
        return _attr(gm, a.target) if isinstance(a, Node) and a.op == "get_attr" else a

    errors = {}  # the weight error W_int8 - W of each op
    with torch.no_grad():
        for op, (q, dq) in targets.items():
            w = const(q.args[0])
            w_q = dq.target(q.target(w, *map(const, q.args[1:])), *map(const, dq.args[1:]))
            errors[op] = w_q - w
    sums: dict[Node, torch.Tensor] = {}
    count = 0

    class _FloatPath(Interpreter):
        def run_node(self, n: Node) -> object:
            if _is_qdq(n):
                return self.env[n.args[0]]
            out = super().run_node(n)
            if n in errors:
                args, kwargs = self.fetch_args_kwargs_from_env(n)
                if n.target in MATMUL_WEIGHTED_OPS:  # addmm(bias, x, W): the error of x @ W
                    err = torch.mm(args[1], errors[n])
                else:
                    err = n.target(args[0], errors[n], None, *args[3:], **kwargs)
                ch = err.dim() - 1 if n.target in MATMUL_WEIGHTED_OPS | {aten.linear.default} else 1
                mean = err.double().mean(dim=[d for d in range(err.dim()) if d != ch])
                sums[n] = sums[n] + mean if n in sums else mean
            return out

    with torch.no_grad():
        for s in samples:
            _FloatPath(gm).run(*s)
            count += 1
    corrections: dict[str, str | None] = {}
    for i, (op, total) in enumerate(sums.items()):
        bi = 0 if op.target in MATMUL_WEIGHTED_OPS else 2
        bias = op.args[bi] if len(op.args) > bi else None
        if bias is not None and not (isinstance(bias, Node) and bias.op == "get_attr"):
            continue  # a computed bias: left alone
        old = _attr(gm, bias.target) if bias is not None else torch.zeros(total.shape[0])
        name = f"_bias_corrected_{i}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, (old.double() - total / count).to(old.dtype))
        with gm.graph.inserting_before(op):
            node = gm.graph.get_attr(name)
        node.meta["val"] = getattr(gm, name)
        args = list(op.args) + [None] * (3 - len(op.args))
        args[bi] = node
        op.args = tuple(args)
        corrections[op.name] = bias.name if bias is not None else None
    gm.meta[_BIAS_CORRECTIONS_KEY] = corrections
    gm.recompile()
    return corrections


def _attr(gm: GraphModule, target: str) -> torch.Tensor:
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def _bias_correction_of(quantizer: object) -> bool:
    config = getattr(quantizer, "config", None)
    return isinstance(config, SymmetricQuantizationConfig) and config.bias_correction and not config.dynamic


def convert_calibrated(prepared: GraphModule, quantizer: object, samples: Iterable[tuple],
                       fold_quantize: bool = True) -> GraphModule:
    """``convert_pt2e(prepared, fold_quantize=...)`` of a calibrated module, with :func:`correct_biases` on
    ``samples`` (the calibration samples) when ``quantizer`` is a :class:`SymmetricInt8Quantizer` whose config
    asks for it; the weights are folded to int8 afterwards as ``convert_pt2e`` folds them."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    if not _bias_correction_of(quantizer):
        return convert_pt2e(prepared, fold_quantize=fold_quantize)
    from torchao.quantization.pt2e.constant_fold import constant_fold
    from torchao.quantization.pt2e.quantize_pt2e import _quant_node_constraint

    gm = convert_pt2e(prepared, fold_quantize=False)
    correct_biases(gm, samples)
    if fold_quantize:
        constant_fold(gm, _quant_node_constraint)
    return gm
