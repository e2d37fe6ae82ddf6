"""Configuration objects of the compiler: ``EdgeCompileConfig`` and ``ExecutorchBackendConfig``."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edgetorch.errors import ExportError, MemoryPlanError
from edgetorch.exir.memory_planning import ALGORITHMS, MemoryPlanningPass
from edgetorch.exir.symbolic import ConstraintBasedSymShapeEvalPass, SymShapeEvalPass
from edgetorch.formats.alignment import ALIGNMENT

__all__ = ["DEFAULT_PRESERVED_OPS", "EdgeCompileConfig", "ExecutorchBackendConfig"]

#: Ops kept whole (not decomposed) by default. ``scaled_dot_product_attention`` decomposes into ~25 nodes
#: with a costly "safe softmax" tail; kept whole it runs through ATen's fused CPU kernel.
DEFAULT_PRESERVED_OPS: tuple = (torch.ops.aten.scaled_dot_product_attention.default,)


@dataclass
class EdgeCompileConfig:
    """How ``to_edge`` turns an ATen program into the edge dialect.

    ``preserve_ops``: ATen ops left whole by decomposition (default: ``DEFAULT_PRESERVED_OPS``).
    ``_check_ir_validity``: run the edge verifier (rejects ops the runtime cannot execute).
    ``_skip_dim_order``: accepted for compatibility with the reference API; edgetorch keeps strides.
    ``_core_aten_ops_exception_list``: the reference's verifier lets these non-core ATen ops through; edgetorch's
    has no core-ATen check (every ATen op the runtime executes passes), so a non-empty list, which would do
    nothing, is refused (``ExportError``): ``preserve_ops`` keeps an op whole through decomposition.
    """

    preserve_ops: tuple = DEFAULT_PRESERVED_OPS
    _check_ir_validity: bool = True
    _skip_dim_order: bool = True
    _core_aten_ops_exception_list: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self._core_aten_ops_exception_list:
            raise ExportError(
                "EdgeCompileConfig._core_aten_ops_exception_list: edgetorch's edge verifier has no core-ATen check "
                "(every ATen op the runtime can execute passes), so the list would do nothing; leave it empty "
                f"(preserve_ops keeps an op whole through decomposition): {list(self._core_aten_ops_exception_list)}")


@dataclass
class ExecutorchBackendConfig:
    """How ``to_executorch`` plans memory and emits the program.

    ``alignment``: byte alignment of every planned tensor in the arena (64).
    ``memory_planning_algo``: "greedy" tries several greedy orders and keeps the smallest arena; the name of one
    order ("greedy_by_size", "greedy_by_start", "greedy_by_size_x_lifetime") plans with that order only
    (``exir.memory_planning.ALGORITHMS``; another name is refused with ``MemoryPlanError``).
    ``emit_stacktrace``: store each instruction's source line in the program.
    ``extract_delegate_segments``: accepted for compatibility; delegate blobs always live in segments.
    ``memory_planning_pass``: a ``MemoryPlanningPass`` (``exir.passes``); its algorithm and alignment, when set,
    take the place of the two fields above, and ``share_mutable_buffers`` says whether the methods share their
    mutable buffers. None (the default): edgetorch's own plan, in which the methods share them by name.
    ``passes``: graph passes run on every method's edge program right before planning and emission (as
    ``EdgeProgramManager.transform`` runs them: on a copy, debug handles filled, the edge verifier run again).
    ``emit_mutable_buffer_names``: only True: the program always stores each mutable buffer's name (the runtime
    keys the state by it); False is refused (``ExportError``).
    ``to_out_var_pass``: only None: the emitter picks each op's out variant itself; a pass given here could not
    run and is refused (``ExportError``).
    ``sym_shape_eval_pass``: where a dynamic shape's planned size comes from: ``ConstraintBasedSymShapeEvalPass()``
    (the default: each ``Dim``'s max; every size the constraints allow runs) or ``HintBasedSymShapeEvalPass()``
    (the example inputs' sizes: a smaller arena, and the runtime refuses a dim above the example's), both from
    ``exir.passes.sym_shape_eval_pass``; or a dict method name -> one of them (a method not named gets the
    default). Anything else is refused (``ExportError`` naming the field).
    ``segment_alignment`` / ``constant_tensor_alignment`` / ``delegate_alignment``: edgetorch's file starts every
    constant and delegate blob on a 64-byte boundary of the file (``formats.alignment.ALIGNMENT``), so None (the
    default) or a power of two dividing 64 is met as it is; a wider one is refused (``ExportError``), since the
    layout cannot honour it.
    ``remove_view_copy``: only True: view ops are always emitted as load-time aliases of their base (no copy).
    ``enable_non_cpu_memory_planning``: True or False, the same plan: edgetorch plans one CPU arena per method and
    no tensor of its programs lives on another device.
    ``external_constants`` / ``external_mutable_weights``: only False: every constant and initial buffer value is
    stored in the .pte itself (edgetorch writes no separate .ptd data file).
    """

    alignment: int = 64
    memory_planning_algo: str = "greedy"
    emit_stacktrace: bool = True
    extract_delegate_segments: bool = True
    memory_planning_pass: MemoryPlanningPass | None = None
    passes: list = field(default_factory=list)
    emit_mutable_buffer_names: bool = True
    to_out_var_pass: object = None
    sym_shape_eval_pass: SymShapeEvalPass | dict = field(default_factory=ConstraintBasedSymShapeEvalPass)
    segment_alignment: int | None = None
    constant_tensor_alignment: int | None = None
    delegate_alignment: int | None = None
    remove_view_copy: bool = True
    enable_non_cpu_memory_planning: bool = True
    external_constants: object = False
    external_mutable_weights: bool = False

    def __post_init__(self) -> None:
        if self.memory_planning_algo not in ALGORITHMS:
            raise MemoryPlanError(f"ExecutorchBackendConfig.memory_planning_algo {self.memory_planning_algo!r} is "
                                  f"unknown: one of {', '.join(ALGORITHMS)}")
        a = self.alignment
        if isinstance(a, bool) or not isinstance(a, int) or a < ALIGNMENT or a & (a - 1):
            raise MemoryPlanError(f"ExecutorchBackendConfig.alignment {a!r}: a power of two of at least {ALIGNMENT} "
                                  "(the loader refuses a planned tensor off that boundary)")
        if self.memory_planning_pass is not None and not isinstance(self.memory_planning_pass, MemoryPlanningPass):
            raise MemoryPlanError("ExecutorchBackendConfig.memory_planning_pass must be an "
                                  "edgetorch.exir.passes.MemoryPlanningPass, got "
                                  f"{type(self.memory_planning_pass).__name__}")
        if not self.emit_mutable_buffer_names:
            raise ExportError("ExecutorchBackendConfig.emit_mutable_buffer_names=False: edgetorch programs always "
                              "store their mutable buffers' names (the runtime keys each buffer's state by it)")
        if self.to_out_var_pass is not None:
            raise ExportError("ExecutorchBackendConfig.to_out_var_pass: edgetorch's emitter picks each op's out "
                              "variant itself, so this pass would never run; leave it None")
        _check_sym_shape_eval_pass(self.sym_shape_eval_pass)
        _check_layout_fields(self)
        if not isinstance(self.passes, (list, tuple)) or not all(callable(p) for p in self.passes):
            raise ExportError("ExecutorchBackendConfig.passes must be a list of graph passes (callables taking a "
                              "torch.fx.GraphModule)")

    def sym_shape_eval_for(self, method: str) -> SymShapeEvalPass:
        """The ``sym_shape_eval_pass`` that bounds ``method``'s dynamic shapes."""
        p = self.sym_shape_eval_pass
        return p.get(method, ConstraintBasedSymShapeEvalPass()) if isinstance(p, dict) else p

    @property
    def planning_algorithm(self) -> str:
        """The algorithm planning uses: the memory planning pass's, else ``memory_planning_algo``."""
        mpp = self.memory_planning_pass
        return mpp.memory_planning_algo if mpp is not None and mpp.memory_planning_algo else self.memory_planning_algo

    @property
    def planning_alignment(self) -> int:
        """The alignment planning uses: the memory planning pass's, else ``alignment``."""
        mpp = self.memory_planning_pass
        return mpp.alignment if mpp is not None and mpp.alignment else self.alignment

    @property
    def shares_mutable_buffers(self) -> bool:
        """Whether the methods share their mutable buffers (True without a memory planning pass)."""
        return self.memory_planning_pass is None or self.memory_planning_pass.share_mutable_buffers


def _check_sym_shape_eval_pass(p: object) -> None:
    items = p.items() if isinstance(p, dict) else [(None, p)]
    for method, one in items:
        if method is not None and not isinstance(method, str):
            raise ExportError(f"ExecutorchBackendConfig.sym_shape_eval_pass: a dict's keys are method names, got "
                              f"{method!r}")
        if not isinstance(one, SymShapeEvalPass):
            where = "" if method is None else f"[{method!r}]"
            hint = " (an instance, not the class)" if isinstance(one, type) else ""
            raise ExportError(f"ExecutorchBackendConfig.sym_shape_eval_pass{where}: {one!r} is not one edgetorch "
                              "plans with: ConstraintBasedSymShapeEvalPass() or HintBasedSymShapeEvalPass() from "
                              f"edgetorch.exir.passes.sym_shape_eval_pass{hint}, or a dict method name -> one")


def _check_layout_fields(config: ExecutorchBackendConfig) -> None:
    for name in ("segment_alignment", "constant_tensor_alignment", "delegate_alignment"):
        a = getattr(config, name)
        if a is None:
            continue
        if isinstance(a, bool) or not isinstance(a, int) or a < 1 or a & (a - 1):
            raise ExportError(f"ExecutorchBackendConfig.{name} {a!r}: a power of two (or None)")
        if ALIGNMENT % a:
            raise ExportError(f"ExecutorchBackendConfig.{name}={a}: edgetorch's file layout starts every constant "
                              f"and delegate blob on a {ALIGNMENT}-byte boundary and cannot honour a wider one "
                              f"(None, or a power of two up to {ALIGNMENT}, is met as it is)")
    only = {"remove_view_copy": True, "enable_non_cpu_memory_planning": None, "external_constants": False,
            "external_mutable_weights": False}
    why = {"remove_view_copy": "edgetorch always emits a view op as a load-time alias of its base (no copy)",
           "external_constants": "edgetorch stores every constant in the .pte itself (no separate .ptd file)",
           "external_mutable_weights": "edgetorch stores every initial buffer value in the .pte itself (no "
                                       "separate .ptd file)"}
    for name, value in only.items():
        v = getattr(config, name)
        if not isinstance(v, bool):
            raise ExportError(f"ExecutorchBackendConfig.{name} must be True or False, got {v!r}"
                              + (f" ({why[name]})" if name in why else ""))
        if value is not None and v != value:
            raise ExportError(f"ExecutorchBackendConfig.{name}={v}: {why[name]}")
