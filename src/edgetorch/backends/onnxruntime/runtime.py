"""The runtime side of the onnxruntime backend (needs onnxruntime, onnx, numpy and torch; not the compiler).

``init`` unpacks the blob (``_blob``), wraps the external weights as zero-copy ``OrtValue``s (shared by every
session of the delegate) and builds the plain ``InferenceSession``, or reuses the one a delegate of the same
program with the same blob built (``_weights``: weights only ``Gather`` reads are bound, not copied). A plain
``execute`` binds the planned input and output tensors to the session once with ``IOBinding`` (data pointers,
element types, shapes), so ORT reads the inputs and writes the outputs in place, and then only calls
``run_with_iobinding``. With optimizations on, the plain (and profiling) session runs the model with int8
activations moved to uint8 (``_qdq``: ORT's integer kernels then take every quantized conv, add and gemm); debug
sessions run the exported model, whose values are the edge program's.

Traced runs (the runtime passes its ETDump tracer):

* per-op timings: ORT's profiler can only be stopped once per session, so a run is profiled with a fresh
  session built with ``enable_profiling`` (the same options otherwise): in a run that logs intermediates, the
  exposing session below (its timings are those of the graph whose values are logged, and one build serves
  both), else a plain one (its outputs are the real outputs). The ``profile_ops`` compile spec chooses which
  traced runs pay for that build: ``first`` (default: the first traced run of each delegate), ``every`` or
  ``off``. Each ORT kernel event is logged with
  ``log_delegate_profile`` under the original ONNX node name when it can be recovered from ORT's fused name
  (else ORT's own name), with ``{"op", "ort_node"}`` JSON metadata.
* dynamic shapes: a blob records dynamic dims by name (``"s27"``) or expression (``"2*s27"``) with each
  symbol's ``[min, max]``. The runtime hands the delegate inputs and planned outputs shaped for this run (views
  of memory planned at the upper bounds): a binding is keyed on pointers *and* shapes, and on a new key the
  shapes are checked (``_shapes.bind``: a wrong rank, static dim, inconsistent or out-of-bounds symbol raises
  ``RuntimeInputError`` naming the input/output and dim).
* intermediate outputs (when the tracer keeps a debug buffer): a second session of the same model with the
  values listed in the blob's ``intermediates`` appended to ``graph.output`` runs on the same inputs (built at
  load, see below; it packs no weights of its own, so a debug run keeps one packed copy resident). Their
  shapes for this run are computed from the blob's ``shapes`` and the input dims, so ORT writes them straight
  into memory the tracer lends with exactly those shapes (a blob without them, or a dim the evaluator cannot
  compute, falls back to learning the shapes with one ``session.run``). Values
  are logged per edge op group with ``log_delegate_output(id, value)``: ``id`` is a key of the delegate's
  debug handle map (the ONNX name of the group's first value) and ``value`` the group's output tensor, or the
  list of its output tensors for groups with several (e.g. ``unbind``).
* observer effect: exposing values can stop ORT fusing the ops that produce them. In a checked debug run the
  real outputs come from the plain session (so the run returns exactly what a plain run returns) and the
  final outputs of the exposing session are compared with them: the largest relative difference
  (max |a - b| / max |b| over the outputs; above ``OBSERVER_EFFECT_TOLERANCE`` the exposed values are not
  what a plain run computes) is logged as a delegate debug event with id ``"observer_effect"`` (a float) and
  kept in ``OrtDelegate.last_observer_effect``. The ``observer_effect`` spec picks the checked runs: ``off`` (a
  debug run runs the exposing session alone and returns its outputs, so it costs about one plain run),
  ``first`` (the first debug run of each delegate: one plain run more, once), ``every``, or ``auto`` (the
  default): ``first`` for a quantized model, where exposing the Q/DQ values stops ORT running its integer
  kernels (the exposed run computes something else than the deployed one), ``off`` for a float model, where
  the values an exposed output unfuses agree with the fused ones to float rounding.
* preparation at load: when a tracer that logs intermediates is attached (``OrtRuntime.observe``, called by
  the runtime when the program is loaded with a debug buffer), the exposing session is built right away,
  armed for profiling when the first traced run profiles, so the first debug run pays for no session build.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from edgetorch.backends.onnxruntime import _blob, _qdq, _shapes, _weights
from edgetorch.errors import ProgramFormatError, RuntimeInputError
from edgetorch.formats import etdump as ed
from edgetorch.runtime._copy import copy_into
from edgetorch.runtime.backend_registry import register_backend

__all__ = ["NAME", "OBSERVER_EFFECT_ID", "OBSERVER_EFFECT_TOLERANCE", "set_runtime_options", "OpEvent", "OrtDelegate",
           "OrtRuntime"]

NAME = "onnxruntime"
#: the reserved delegate debug id of the observer-effect event, and the relative difference above which a debug
#: run's exposed outputs count as changed by the observation (both defined by the ETDump format)
OBSERVER_EFFECT_ID = ed.OBSERVER_EFFECT_ID
OBSERVER_EFFECT_TOLERANCE = ed.OBSERVER_EFFECT_TOLERANCE

_DEFAULTS: dict[str, str] = {
    "graph_optimization_level": "ORT_ENABLE_ALL",
    "intra_op_num_threads": "0",
    "profile_ops": "first",
    "observer_effect": "auto",
    "allow_spinning": "0",
    # how sessions get the blob's weights: "copy" (add_external_initializers: ORT copies them per session) or
    # "share" (SessionOptions.add_initializer over the program's memory; ORT needs the model to hold the data too,
    # so a transient inline copy is made). "prepack": "0" disables ORT's weight prepacking (MatMulNBits then
    # dequantizes per call). Chosen by measurement (docs/performance.md, llama_100m 8da4w): "copy" + prepacking
    # holds the least resident memory and decodes fastest; "share" keeps 120 MiB more, prepack "0" is 33x slower.
    "weights": "copy",
    "prepack": "1",
    "in_place_ops": ",".join(sorted(_weights.IN_PLACE_OPS)),  # weights only these read: bound, not copied ("": off)
}
_OVERRIDES: dict[str, str] = {}
_LOCK = threading.Lock()

_NP_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.int64: np.int64,
    torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
}


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {np.dtype(v): k for k, v in _NP_DTYPES.items()}


def set_runtime_options(**options: object) -> None:
    """Process-wide overrides of the delegate compile specs for delegates loaded afterwards, e.g.
    ``set_runtime_options(profile_ops="every", intra_op_num_threads=1)``; ``None`` removes an override."""
    with _LOCK:
        for k, v in options.items():
            if k not in _DEFAULTS:
                raise ValueError(f"unknown onnxruntime runtime option '{k}'; known: {sorted(_DEFAULTS)}")
            if v is None:
                _OVERRIDES.pop(k, None)
            else:
                _OVERRIDES[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)


def _options(compile_specs: dict[str, bytes]) -> dict[str, str]:
    out = dict(_DEFAULTS)
    for k, v in compile_specs.items():
        out[k] = v.decode() if isinstance(v, (bytes, bytearray)) else str(v)
    with _LOCK:
        out.update(_OVERRIDES)
    return out


@dataclass
class _Binding:
    io: Any
    pre: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (src, staging) before run
    post: list[_Store] = field(default_factory=list)  # staged outputs copied into their slots after the run


class _Store:
    """Copies a staged output into its planned slot, narrowed to index 0 along every dimension the slot
    broadcasts (stride 0), so that ``copy_`` never writes one memory location twice (planned outputs of
    ``expand`` are such views). The staged values must then be equal along those dimensions: a slot edited into
    a broadcast would otherwise keep one of the delegate's values and drop the others (typed error instead)."""

    def __init__(self, staged: torch.Tensor, dst: torch.Tensor, name: str) -> None:
        self.staged, self.name, src = staged, name, staged
        self.dims = [d for d in range(dst.dim()) if dst.stride(d) == 0 and dst.shape[d] > 1]
        for d in self.dims:
            src, dst = src.narrow(d, 0, 1), dst.narrow(d, 0, 1)
        self.src, self.dst = src, dst

    def __call__(self) -> None:
        if self.dims and not torch.equal(self.staged, self.src.expand_as(self.staged)):
            raise ProgramFormatError(
                f"onnxruntime delegate output '{self.name}' is planned as a broadcast along dims {self.dims} (stride "
                "0), but the delegate computed values that differ along them (the file is inconsistent: corrupted or "
                "edited?)", field=f"delegate output {self.name}.strides")
        self.dst.copy_(self.src)


def _key(tensors: Sequence[torch.Tensor]) -> tuple:
    """What a binding depends on: each tensor's address, shape and strides (dynamic shapes change per run)."""
    return tuple((t.data_ptr(), t.shape, t.stride()) for t in tensors)


@dataclass(frozen=True)
class OpEvent:
    """One ORT kernel execution from the profiler, in ``time.perf_counter_ns`` time."""

    delegate_id: str
    ort_node: str
    op: str
    start_ns: int
    end_ns: int


class OrtDelegate:
    """One loaded delegate: its sessions, bindings and debug tables."""

    def __init__(self, processed: memoryview | bytes, compile_specs: dict[str, bytes] | None = None,
                 named_data: Callable[[str], memoryview] | Mapping[str, bytes] | None = None) -> None:
        unpacked = _blob.unpack(processed, named_data=named_data)
        self.header = unpacked.header
        self.options = _options(compile_specs or {})
        self._blob_ref = processed  # the weights below are views of it
        self._arrays = unpacked.initializers
        self._model_bytes = bytes(unpacked.model)
        self._ortvalues = {k: ort.OrtValue.ortvalue_from_numpy(a) for k, a in self._arrays.items()}
        self.input_names = [i["name"] for i in self.header["inputs"]]
        self.output_names = [o["name"] for o in self.header["outputs"]]
        #: ``{symbol: [min, max]}`` of the dynamic dims (empty: every shape is static)
        self.dim_bounds: dict[str, list] = dict(self.header.get("dims") or {})
        self._shape_cache: dict[tuple, list | None] = {}
        self._debug_specs: list[tuple[list, torch.dtype]] | None = None
        self._scratch: dict[str, torch.Tensor] = {}
        self.intermediates: list[str] = list(self.header.get("intermediates", []))
        self.groups: list[tuple[str, list[str]]] = [(g[0], list(g[1])) for g in self.header.get("groups", [])]
        #: debug-buffer bytes one debug run logs (the tracer reserves them before the run); None: unknown
        db = self.header.get("debug_bytes")
        self.debug_buffer_bytes: int | None = int(db) if isinstance(db, int) and db >= 0 else None
        threads = int(self.options["intra_op_num_threads"] or 0)
        self.num_threads = threads if threads > 0 else torch.get_num_threads()
        self._bound: list[str] = []  # weights the plain model reads as graph inputs (``_weights``)
        self._plain_bytes = self._plain_model()
        try:
            self.session = _weights.shared_session(named_data, processed, self.options,
                                                   lambda: self._make_session(self._plain_bytes))
        except Exception as e:
            raise _blob.OrtBlobError(f"ONNX Runtime rejected the model: {type(e).__name__}: {e}",
                                     field="model") from e
        if self.options["weights"] == "copy":  # ORT holds its own copy now: the program's pages may go
            release = getattr(getattr(named_data, "__self__", None), "release_named_data", None)
            for e in self.header["initializers"] if release is not None else ():
                if "key" in e:
                    release(e["key"])
        self._binding: _Binding | None = None
        self._binding_key: tuple = ()
        self._debug_session: Any = None
        self._debug_armed = False  # its next run is profiled
        self._debug_model: bytes | None = None
        self._run_ns = 0
        self._debug_outputs: list[str] = []
        self._debug_binding: _Binding | None = None
        self._debug_bufs: list[torch.Tensor] = []
        self._debug_key: tuple = ()
        self._producers: dict[str, str] | None = None
        self.profiled_runs = 0
        self.last_observer_effect: float | None = None
        self.observer_checks = 0
        self.last_profile: list[OpEvent] = []

    # -- sessions -----------------------------------------------------------------------------------
    def _plain_model(self) -> bytes:
        """The model of the plain and profiling sessions: the exported one, with int8 activations moved to
        uint8 where optimizations are on (``_qdq``: lets ORT's integer kernels take every quantized op), and the
        weights only ``in_place_ops`` read made graph inputs bound to the blob's memory (``_weights``)."""
        qdq = self.options["graph_optimization_level"] != "ORT_DISABLE_ALL" and b"QuantizeLinear" in self._model_bytes
        ops = frozenset(o for o in self.options["in_place_ops"].split(",") if o)
        if not qdq and not (ops and self._ortvalues):
            return self._model_bytes
        import onnx

        proto = onnx.ModelProto()
        proto.ParseFromString(self._model_bytes)
        self._bound = _weights.in_place_weights(proto, self._ortvalues, ops)
        changed = _weights.rewrite(proto, self._bound)
        changed = (qdq and _qdq.activations_to_uint8(proto)) or changed
        return proto.SerializeToString() if changed else self._model_bytes

    def session_options(self, profile_prefix: str | None = None, spin: bool = True,
                        weights: bool = True) -> ort.SessionOptions:
        """Options of this delegate's sessions; ``weights``: hand them the blob's weights as external
        initializers."""
        so = ort.SessionOptions()
        level = self.options["graph_optimization_level"]
        try:
            so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        except AttributeError:
            raise _blob.OrtBlobError(f"unknown graph_optimization_level '{level}'", field="compile_specs") from None
        so.intra_op_num_threads = self.num_threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        so.add_session_config_entry("session.intra_op.allow_spinning", self.options["allow_spinning"] if spin else "0")
        if self.options["prepack"] == "0":
            so.add_session_config_entry("session.disable_prepacking", "1")
        names = [n for n in self._ortvalues if n not in self._bound]
        if weights and names:
            if self.options["weights"] == "copy":
                so.add_external_initializers(names, [self._ortvalues[n] for n in names])
            else:  # ORT keeps a pointer to the caller's buffer (the mapped program): no copy unless it prepacks
                for n in names:
                    so.add_initializer(n, self._ortvalues[n])
        if profile_prefix is not None:
            so.enable_profiling = True
            so.profile_file_prefix = profile_prefix
        return so

    def _make_session(self, model: bytes, profile_prefix: str | None = None, spin: bool = True) -> Any:
        if self._ortvalues and self.options["weights"] == "share":
            model = _weights.inline(model, self._arrays)
        return ort.InferenceSession(model, self.session_options(profile_prefix, spin),
                                    providers=["CPUExecutionProvider"])

    def _exposing_model(self) -> bytes:
        """The exported model with every value in ``intermediates`` appended to its outputs (built once). Its
        external weights are graph inputs, bound to the blob's memory in each run (``_bind_debug``): ORT copies
        weights handed as external initializers (ViT-B/16: 330 MB more per session) but reads inputs in place."""
        if self._debug_model is None:
            import onnx

            proto = onnx.ModelProto()
            proto.ParseFromString(self._model_bytes)
            g = proto.graph
            weights = [t for t in g.initializer if t.name in self._ortvalues]
            kept = [t for t in g.initializer if t.name not in self._ortvalues]
            del g.initializer[:]
            g.initializer.extend(kept)
            g.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in weights)
            have = {o.name for o in proto.graph.output}
            for name in self.intermediates:
                if name not in have:
                    proto.graph.output.append(onnx.ValueInfoProto(name=name))
                    have.add(name)
            self._debug_outputs = [o.name for o in proto.graph.output]
            self._debug_specs = self._specs_of(self._debug_outputs)
            self._debug_model = proto.SerializeToString()
        return self._debug_model

    def debug_session(self, profile: bool = False) -> Any:
        """The session whose outputs are the real outputs followed by every value in ``intermediates``.

        It neither copies nor packs the weights (``_exposing_model``): a debug run keeps one packed copy
        resident, the plain session's. With ``profile`` its next run is profiled: the session built by
        ``prepare_traced`` is armed for that already; otherwise a new one is built (it replaces the current one:
        after ``end_profiling`` it runs unprofiled; an armed session asked for an unprofiled run is replaced too)."""
        if self._debug_session is None or profile != self._debug_armed:
            model = self._exposing_model()
            so = self.session_options(self._profile_prefix() if profile else None, spin=False, weights=False)
            self._debug_session = None
            self._debug_binding, self._debug_key = None, ()
            self._debug_session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            self._debug_armed = profile
        return self._debug_session

    def prepare_traced(self, tracer: Any) -> None:
        """Builds now what the first run traced by ``tracer`` needs (the runtime calls it when ``tracer`` is
        attached, at load): the exposing session when it logs intermediate values, armed for profiling when the
        first traced run profiles. A build error is left to that run, which raises it where it belongs."""
        if tracer is None or not getattr(tracer, "logs_intermediates", False):
            return
        if getattr(tracer, "log_delegate_output", None) is None or self._debug_session is not None:
            return
        profile = getattr(tracer, "log_delegate_profile", None) is not None and self.wants_profile()
        try:
            self.debug_session(profile)
        except Exception:  # noqa: BLE001 - re-raised by the run that needs the session
            self._debug_session = None

    def _specs_of(self, names: list[str]) -> list[tuple[list, torch.dtype]] | None:
        """(recorded shape, dtype) of each named value from the blob's outputs and ``shapes``; None if one is
        missing or not fully known."""
        known = {o["name"]: o for o in self.header["outputs"]}
        known.update({k: {"name": k, **v} for k, v in (self.header.get("shapes") or {}).items() if k not in known})
        out = []
        for n in names:
            e = known.get(n)
            shape, dtype = (e.get("shape"), e.get("dtype")) if e else (None, None)
            if shape is None or dtype is None or any(isinstance(d, int) and d < 0 for d in shape):
                return None
            out.append((list(shape), _TORCH_DTYPES.get(np.dtype(dtype))))
        return None if any(dt is None for _, dt in out) else out

    # -- plain runs ---------------------------------------------------------------------------------
    def _bind(self, session: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> _Binding:
        if len(inputs) != len(self.input_names) or len(outputs) != len(self.output_names):
            raise RuntimeError(f"onnxruntime delegate expects {len(self.input_names)} inputs and "
                               f"{len(self.output_names)} outputs, got {len(inputs)} and {len(outputs)}")
        self.check_shapes(inputs, outputs)
        b = self._bind_names(session, self.input_names, inputs, self.output_names, outputs)
        for name in self._bound:  # read in place from the program's memory
            b.io.bind_ortvalue_input(name, self._ortvalues[name])
        return b

    def symbols(self, inputs: Sequence[torch.Tensor]) -> dict[str, int]:
        """The value of every dynamic dim symbol in this run (checked against the blob; ``RuntimeInputError``)."""
        return _shapes.bind(self.header["inputs"], [tuple(t.shape) for t in inputs], self.dim_bounds)

    def check_shapes(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Raises ``RuntimeInputError`` naming the input or output and dim whose size does not fit the blob."""
        env = self.symbols(inputs)
        for spec, t in zip(self.header["outputs"], outputs):
            want = spec.get("shape")
            if want is None:
                continue
            if len(want) != t.dim():
                raise RuntimeInputError(f"onnxruntime delegate output '{spec['name']}' has rank {t.dim()}, the "
                                        f"delegate computes rank {len(want)} {want}")
            for d, (w, got) in enumerate(zip(want, t.shape)):
                try:
                    expect = _shapes.eval_dim(w, env)
                except _shapes.UnsupportedDimError:
                    continue
                if expect >= 0 and expect != got:
                    raise RuntimeInputError(f"onnxruntime delegate output '{spec['name']}' dim {d} ({w}) is {got}, "
                                            f"this run computes {expect} (shape {list(t.shape)})")

    @staticmethod
    def _bind_names(session: Any, input_names: list[str], inputs: Sequence[torch.Tensor], output_names: list[str],
                    outputs: Sequence[torch.Tensor]) -> _Binding:
        b = _Binding(session.io_binding())
        for name, t in zip(input_names, inputs):
            src = t
            if not t.is_contiguous():
                src = torch.empty(t.shape, dtype=t.dtype)
                b.pre.append((t, src))
            b.io.bind_input(name, "cpu", 0, _NP_DTYPES[src.dtype], list(src.shape), src.data_ptr())
        for name, t in zip(output_names, outputs):
            dst = t
            if not t.is_contiguous():
                dst = torch.empty(t.shape, dtype=t.dtype)
                b.post.append(_Store(dst, t, name))
            b.io.bind_output(name, "cpu", 0, _NP_DTYPES[dst.dtype], list(dst.shape), dst.data_ptr())
        return b

    def run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """Runs the plain session reading ``inputs`` and writing ``outputs`` in place."""
        key = _key(inputs) + _key(outputs)
        b = self._binding
        if b is None or key != self._binding_key:
            b = self._binding = self._bind(self.session, inputs, outputs)
            self._binding_key = key
        for src, dst in b.pre:
            dst.copy_(src)
        self.session.run_with_iobinding(b.io)
        for store in b.post:
            store()

    def run_without_binding(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> None:
        """``session.run`` with numpy feeds, results copied into ``outputs`` (the slower path; for comparison)."""
        res = self.session.run(self.output_names, self._feeds(inputs))
        for o, r in zip(outputs, res):
            o.copy_(torch.from_numpy(r))

    def _feeds(self, inputs: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
        feeds = {n: t.detach().contiguous().numpy() for n, t in zip(self.input_names, inputs)}
        return feeds | {n: self._arrays[n] for n in self._bound}

    def debug_feeds(self, inputs: Sequence[torch.Tensor | np.ndarray]) -> dict[str, Any]:
        """Feeds of ``debug_session().run``: the inputs and the weights, graph inputs of the exposing model
        (ORT's Python ``run`` asks for every graph input; IOBinding runs need only the real inputs)."""
        feeds: dict[str, Any] = {n: t.detach().contiguous().numpy() if isinstance(t, torch.Tensor) else t
                                 for n, t in zip(self.input_names, inputs)}
        feeds.update(self._arrays)
        return feeds

    # -- debug runs ---------------------------------------------------------------------------------
    def capture_intermediates(self, inputs: Sequence[torch.Tensor], lend: Any = None, profile: bool = False,
                              ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """Runs the exposing session: returns {value name: tensor} for ``intermediates`` and the final outputs.

        Outputs are bound with IOBinding at this run's shapes (``debug_shapes``) so ORT writes them in place:
        intermediates into ``lend(shape, dtype)`` (the tracer's ``delegate_output_buffer``: memory of the debug
        buffer itself, so logging them copies nothing) when it lends memory, else into scratch buffers of this
        delegate that its next capture overwrites. Final outputs always go to the delegate's scratch buffers.
        When the shapes cannot be computed, the first capture of each input shape learns them with
        ``session.run``. With ``profile`` the run is profiled op by op (a new exposing session:
        ``debug_session``) and its kernel events are left in ``last_profile``."""
        sess = self.debug_session(profile)
        shapes = self.debug_shapes(inputs)
        if shapes is None:
            outs = self._capture_learning(sess, inputs, lend)
        else:
            outs = self._capture_bound(sess, inputs, shapes, lend)
        if profile:
            self._debug_armed = False
            self._profile_events(sess, self._run_ns)
        by_name = dict(zip(self._debug_outputs, outs))
        finals = [by_name[n] for n in self.output_names]
        return {n: by_name[n] for n in self.intermediates if n in by_name}, finals

    def debug_shapes(self, inputs: Sequence[torch.Tensor]) -> list[tuple[tuple[int, ...], torch.dtype]] | None:
        """(shape, dtype) of every output of the exposing session in this run; None when unknown."""
        self._exposing_model()
        key = tuple(t.shape for t in inputs)
        if key in self._shape_cache:
            return self._shape_cache[key]
        specs = self._debug_specs
        out = None
        if specs is not None:
            env = self.symbols(inputs)
            try:
                out = [(_shapes.resolve(shape, env), dtype) for shape, dtype in specs]
            except _shapes.UnsupportedDimError:
                out = None
        if len(self._shape_cache) >= 64:
            self._shape_cache.clear()
        self._shape_cache[key] = out
        return out

    def _scratch_tensor(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of this delegate for value ``name`` (its memory grows to the largest shape seen, then stays)."""
        n = math.prod(shape)
        buf = self._scratch.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = self._scratch[name] = torch.empty(max(n, 1), dtype=dtype)
        return buf[:n].view(shape)

    def _bind_debug(self, sess: Any, inputs: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> _Binding:
        """A binding of the exposing session: the inputs, the blob's weights (graph inputs of that model, bound
        in place) and ``outs``."""
        b = self._bind_names(sess, self.input_names, inputs, self._debug_outputs, outs)
        for name, value in self._ortvalues.items():
            b.io.bind_ortvalue_input(name, value)
        return b

    def _capture_bound(self, sess: Any, inputs: Sequence[torch.Tensor],
                       shapes: list[tuple[tuple[int, ...], torch.dtype]], lend: Any) -> list[torch.Tensor]:
        finals = set(self.output_names)
        outs, lent = [], False
        for name, (shape, dtype) in zip(self._debug_outputs, shapes):
            t = lend(shape, dtype) if lend is not None and name not in finals else None
            lent = lent or t is not None
            outs.append(t if t is not None else self._scratch_tensor(name, shape, dtype))
        key = _key(inputs) + _key(outs)
        b = self._debug_binding
        if lent or b is None or key != self._debug_key:
            b = self._bind_debug(sess, inputs, outs)
            self._debug_binding, self._debug_key = (None, ()) if lent else (b, key)
        self._run_io(sess, b)
        return outs

    def _run_io(self, sess: Any, b: _Binding) -> None:
        """Runs ``sess`` on binding ``b`` (no staged outputs: the exposing session writes in place); the run's
        start is kept in ``_run_ns`` (perf_counter ns) for its profile events."""
        for src, dst in b.pre:
            copy_into(dst, src)
        self._run_ns = time.perf_counter_ns()
        sess.run_with_iobinding(b.io)

    def _capture_learning(self, sess: Any, inputs: Sequence[torch.Tensor], lend: Any) -> list[torch.Tensor]:
        """The first run of an input shape learns the output shapes with ``session.run``; later ones bind."""
        key = ("learned",) + _key(inputs)
        b = self._debug_binding
        if b is None or key != self._debug_key:
            self._run_ns = time.perf_counter_ns()
            res = sess.run(self._debug_outputs, self.debug_feeds(inputs))
            bufs = [torch.from_numpy(np.ascontiguousarray(r)) for r in res]
            self._debug_binding = self._bind_debug(sess, inputs, bufs)
            self._debug_bufs = bufs
            self._debug_key = key
            return bufs
        outs = self._debug_bufs
        if lend is not None:  # a binding for this run: intermediates into the lent debug-buffer memory
            finals = set(self.output_names)
            lent = [None if n in finals else lend(buf.shape, buf.dtype) for n, buf in zip(self._debug_outputs, outs)]
            outs = [buf if t is None else t for buf, t in zip(outs, lent)]
            b = self._bind_debug(sess, inputs, outs)
        self._run_io(sess, b)
        return outs

    # -- profiling ----------------------------------------------------------------------------------
    def _producer_map(self) -> dict[str, str]:
        if self._producers is None:
            import onnx

            proto = onnx.ModelProto()
            proto.ParseFromString(self._model_bytes)
            prod: dict[str, str] = {}
            for n in proto.graph.node:
                prod[n.name] = n.name
                for o in n.output:
                    prod.setdefault(o, n.name)
            self._producers = prod
        return self._producers

    def profile_id(self, ort_name: str) -> str:
        """The original ONNX node name behind an ORT kernel name (ORT renames fused/rewritten nodes, e.g.
        ``fused node_linear``, ``node_addmm/GemmTransposeFusion/``, ``relu_nchwc``); else ORT's name."""
        prod = self._producer_map()
        base = ort_name.split("/")[0]
        cands = [ort_name, ort_name[6:] if ort_name.startswith("fused ") else "", base]
        for suffix in ("_nchwc", "_new_reshape"):
            if base.endswith(suffix):
                cands.append(base[:-len(suffix)])
        for c in cands:
            if c and c in prod:
                return prod[c]
        return ort_name

    def _profile_prefix(self) -> str:
        return os.path.join(tempfile.gettempdir(), f"edgetorch-ort-profile-{os.getpid()}-{id(self)}")

    def profile_run(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[OpEvent]:
        """Runs a fresh profiling session of the plain model into ``outputs``; returns its kernel events."""
        sess = self._make_session(self._plain_bytes, self._profile_prefix())
        b = self._bind(sess, inputs, outputs)
        for src, dst in b.pre:
            dst.copy_(src)
        t0 = time.perf_counter_ns()
        sess.run_with_iobinding(b.io)
        for store in b.post:
            store()
        return self._profile_events(sess, t0)

    def _profile_events(self, sess: Any, t0: int) -> list[OpEvent]:
        """Ends ``sess``'s profiling (its run started at ``t0``); its kernel events, kept in ``last_profile``."""
        path = sess.end_profiling()
        try:
            with open(path) as f:
                events = json.load(f)
        finally:
            try:
                os.remove(path)
            except OSError:
                pass
        run_ts = next((e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                      None)
        kernels = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
        if run_ts is None:
            run_ts = min((e["ts"] for e in kernels), default=0)
        out = []
        for e in kernels:
            raw = e["name"][:-len("_kernel_time")]
            start = t0 + (int(e["ts"]) - int(run_ts)) * 1000
            out.append(OpEvent(self.profile_id(raw), raw, str(e.get("args", {}).get("op_name", "")), start,
                               start + int(e.get("dur", 0)) * 1000))
        self.profiled_runs += 1
        self.last_profile = out
        return out

    def wants_profile(self) -> bool:
        mode = self.options["profile_ops"]
        return mode == "every" or (mode == "first" and self.profiled_runs == 0)

    # -- traced execution ---------------------------------------------------------------------------
    def observer_effect(self, exposed: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> float:
        worst = 0.0
        for a, b in zip(exposed, outputs):
            if a.numel() == 0:
                continue
            if not (a.is_floating_point() or b.is_floating_point()):
                worst = max(worst, 0.0 if torch.equal(a, b.to(a.dtype)) else float("inf"))
                continue
            a64, b64 = a.double(), b.double()
            scale = max(b64.abs().max().item(), 1e-12)
            worst = max(worst, (a64 - b64).abs().max().item() / scale)
        return worst

    def observer_mode(self) -> str:
        mode = {"1": "every", "0": "off"}.get(self.options["observer_effect"], self.options["observer_effect"])
        if mode == "auto":
            return "first" if b"QuantizeLinear" in self._model_bytes else "off"
        if mode not in ("every", "first", "off"):
            raise ValueError(f"onnxruntime: observer_effect must be 'auto', 'every', 'first' or 'off', got {mode!r}")
        return mode

    def execute_traced(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], tracer: Any) -> None:
        """The tracer wiring: profile events, intermediate outputs and the observer effect of one run."""
        log_profile = getattr(tracer, "log_delegate_profile", None)
        log_output = getattr(tracer, "log_delegate_output", None)
        profile = log_profile is not None and self.wants_profile()
        if not (getattr(tracer, "logs_intermediates", False) and log_output is not None):
            if profile:
                self._log_profile(log_profile, self.profile_run(inputs, outputs))
            else:
                self.run(inputs, outputs)
            return
        mode = self.observer_mode()
        check = mode == "every" or (mode == "first" and self.observer_checks == 0)
        if check:  # the run's outputs are the plain session's
            self.run(inputs, outputs)
        values, finals = self.capture_intermediates(inputs, getattr(tracer, "delegate_output_buffer", None),
                                                    profile=profile)
        if profile:
            self._log_profile(log_profile, self.last_profile)
        if not check:  # the exposing session's outputs are the run's outputs
            for j, (o, r) in enumerate(zip(outputs, finals)):
                _Store(r, o, f"output {j}")()
        for gid, names in self.groups:
            vs = [values[n] for n in names if n in values]
            if vs:  # the capture buffers are only rewritten by this delegate's next run: no snapshot needed
                log_output(gid, vs[0] if len(vs) == 1 else vs, snapshot=False)
        if check:
            self.last_observer_effect = self.observer_effect(finals, outputs)
            self.observer_checks += 1
            log_output(OBSERVER_EFFECT_ID, float(self.last_observer_effect))

    @staticmethod
    def _log_profile(log_profile: Any, events: list[OpEvent]) -> None:
        for ev in events:
            meta = json.dumps({"op": ev.op, "ort_node": ev.ort_node}).encode()
            log_profile(ev.delegate_id, ev.start_ns, ev.end_ns, meta)


class OrtRuntime:
    """The ``onnxruntime`` entry of the runtime backend registry."""

    name = NAME
    reads_named_data = True  # init gets the program's named_data lookup (weights shared across methods)

    def init(self, processed: memoryview, compile_specs: dict[str, bytes],
             named_data: Callable[[str], memoryview] | None = None) -> OrtDelegate:
        return OrtDelegate(processed, compile_specs, named_data)

    def observe(self, handle: OrtDelegate, tracer: Any) -> None:
        handle.prepare_traced(tracer)

    def execute(self, handle: OrtDelegate, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                tracer: Any = None) -> None:
        if tracer is None:
            handle.run(inputs, outputs)
        else:
            handle.execute_traced(inputs, outputs, tracer)


register_backend(OrtRuntime())
