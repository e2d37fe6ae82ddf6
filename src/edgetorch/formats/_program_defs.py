"""The in-memory mirror of the program schema (``schema/program.fbs``): file constants, the value and plan
dataclasses, and the debug bytes one traced run stores. ``formats.program`` re-exports every name here; the
writer (``_program_writer``), the reader (``program``) and the consistency checks (``_program_checks``) use it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from edgetorch.formats._generated import program_generated as fb
from edgetorch.formats.alignment import debug_bytes
from edgetorch.formats.dtypes import code_dtype

MAGIC = b"EDGTPROG"
FB_IDENTIFIER = b"EDTP"
HEADER_VERSION = 2  # 2: the content hash is chunked (``content_hash``); 1: plain SHA-256 of the body (still read)
#: 4: control flow (JumpFalseCall, MoveCall); 3: named data; 2: bounded dynamic shapes (symbols, SymInt values),
#: mutable buffers
PROGRAM_SCHEMA_VERSION = 4
#: schema versions this reader reads (a version-1/2 file has no named data: read as empty; before 4, no jumps)
READABLE_SCHEMA_VERSIONS = (1, 2, 3, 4)
CONTROL_FLOW_VERSION = 4  # the first schema version whose instructions may jump and move
HEADER = struct.Struct("<8sIIQQQQ32s")  # magic, header ver, schema ver, fb off, fb size, seg off, seg size, hash
HEADER_SIZE = 128


# ----------------------------------------------------------------------------------------------
# In-memory mirror of the schema
# ----------------------------------------------------------------------------------------------

PLACEMENT_PLANNED = fb.TensorPlacement.PLANNED
PLACEMENT_CONSTANT = fb.TensorPlacement.CONSTANT
PLACEMENT_ALIAS = fb.TensorPlacement.ALIAS
PLACEMENT_DYNAMIC = fb.TensorPlacement.DYNAMIC
PLACEMENT_MUTABLE = fb.TensorPlacement.MUTABLE
MUTABLE_ZERO_INIT = -1  # MutableBufferDef.constant_index of a buffer whose initial value is all zeros (no bytes)

CALL_OUT = fb.CallKind.OUT
CALL_FUNCTIONAL_COPY = fb.CallKind.FUNCTIONAL_COPY
CALL_VIEW = fb.CallKind.VIEW
CALL_FUNCTIONAL = fb.CallKind.FUNCTIONAL
CALL_KIND_NAMES = {CALL_OUT: "OUT", CALL_FUNCTIONAL_COPY: "FUNCTIONAL_COPY", CALL_VIEW: "VIEW",
                   CALL_FUNCTIONAL: "FUNCTIONAL"}


@dataclass
class TensorDef:
    scalar_type: int
    sizes: list[int]
    strides: list[int]
    storage_offset: int
    placement: int
    nbytes: int
    arena_offset: int = -1
    constant_index: int = -1
    sym_shape: str = ""  # JSON sizes/strides/offset expressions of a bounded dynamic shape ("" when static)
    buffer_index: int = -1  # MUTABLE: index into PlanDef.mutable_buffers


@dataclass(frozen=True)
class IntListV:
    items: tuple[int, ...]


@dataclass(frozen=True)
class DoubleListV:
    items: tuple[float, ...]


@dataclass(frozen=True)
class BoolListV:
    items: tuple[bool, ...]


@dataclass(frozen=True)
class TensorListV:
    items: tuple[int, ...]


@dataclass(frozen=True)
class OptionalTensorListV:
    items: tuple[int, ...]  # -1 = None


@dataclass(frozen=True)
class DtypeV:
    scalar_type: int


@dataclass(frozen=True)
class LayoutV:
    value: int


@dataclass(frozen=True)
class MemoryFormatV:
    value: int


@dataclass(frozen=True)
class DeviceV:
    value: str


@dataclass(frozen=True)
class SymIntV:
    expr: str  # one JSON expression (formats.symexpr)


@dataclass(frozen=True)
class SymIntListV:
    exprs: str  # a JSON list of expressions


@dataclass(frozen=True)
class SymbolDef:
    """A bounded dynamic dim: read from dim ``dim`` of user input ``input`` (``dim == -1``: the input is the
    int itself) and checked against ``[min, max]`` at every run."""

    name: str
    min: int
    max: int
    input: int
    dim: int


@dataclass(frozen=True)
class MutableBufferDef:
    """A buffer the method updates in place; its initial value is constant ``constant_index``, or all zeros
    (no stored bytes) when ``constant_index`` is ``MUTABLE_ZERO_INIT``."""

    name: str
    constant_index: int
    scalar_type: int
    sizes: tuple[int, ...]


# A value is one of: None, bool, int, float, str, TensorDef, or one of the *V wrappers above.
Value = Any


@dataclass(frozen=True)
class OperatorDef:
    name: str  # "aten::addmm"
    overload: str  # "out"


@dataclass
class KernelCallDef:
    op_index: int
    kind: int
    args: list[int]
    outputs: list[int]


@dataclass
class DelegateCallDef:
    delegate_index: int
    args: list[int]
    outputs: list[int]


@dataclass
class MoveCallDef:
    """Copies tensor ``move_from`` into the planned tensor ``move_to`` (``formats.control_flow``)."""

    move_from: int
    move_to: int

    @property
    def args(self) -> list[int]:
        return [self.move_from]

    @args.setter
    def args(self, v: list[int]) -> None:
        (self.move_from,) = v

    @property
    def outputs(self) -> list[int]:
        return [self.move_to]

    @outputs.setter
    def outputs(self, v: list[int]) -> None:
        (self.move_to,) = v


@dataclass
class JumpFalseCallDef:
    """Continues at ``destination_instruction`` when value ``cond_value_index`` is false (``formats.control_flow``)."""

    cond_value_index: int
    destination_instruction: int

    @property
    def args(self) -> list[int]:
        return [self.cond_value_index]

    @args.setter
    def args(self, v: list[int]) -> None:
        (self.cond_value_index,) = v

    @property
    def outputs(self) -> list[int]:
        return []

    @outputs.setter
    def outputs(self, v: list[int]) -> None:
        if v:
            raise ValueError("a jump has no outputs")


@dataclass
class InstructionDef:
    call: KernelCallDef | DelegateCallDef | MoveCallDef | JumpFalseCallDef
    node_name: str = ""
    debug_handle: int = 0
    source: str = ""


@dataclass
class BackendDelegateDef:
    backend_id: str
    data_index: int
    compile_specs: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class PlanDef:
    name: str
    values: list[Value]
    inputs: list[int]
    outputs: list[int]
    input_spec: str
    output_spec: str
    input_names: list[str]
    output_names: list[str]
    operators: list[OperatorDef]
    delegates: list[BackendDelegateDef]
    instructions: list[InstructionDef]
    arena_size: int
    debug_buffer_bytes: int
    symbols: list[SymbolDef] = field(default_factory=list)
    mutable_buffers: list[MutableBufferDef] = field(default_factory=list)


def value_nbytes(plan: PlanDef, vid: int) -> int:
    """The bytes of value ``vid`` when it is a tensor (at the upper bound of a dynamic shape), else 0."""
    t = plan.values[vid]
    if not isinstance(t, TensorDef):
        return 0
    n = code_dtype(t.scalar_type).itemsize
    for s in t.sizes:
        n *= s
    return n


def is_view(ins: InstructionDef) -> bool:
    """A VIEW kernel call: evaluated once at load, never run nor logged (by its schema code, ``CALL_VIEW``)."""
    return isinstance(ins.call, KernelCallDef) and ins.call.kind == CALL_VIEW


def is_control(ins: InstructionDef) -> bool:
    """A jump or a move: no kernel, nothing logged (a move's target is logged as a program output, if one)."""
    return isinstance(ins.call, (MoveCallDef, JumpFalseCallDef))


def logged_values(plan: PlanDef) -> list[int]:
    """The one list of what a traced run of ``plan`` logs in the debug buffer, in order: its inputs, every output
    of every non-view instruction (an in-place op logs its slot again), then each program output no instruction
    logs. The tracer plans its logging from it; :func:`run_debug_bytes` sizes it."""
    logged = [o for ins in plan.instructions if not is_view(ins) and not is_control(ins) for o in ins.call.outputs]
    seen = set(logged)
    return [*plan.inputs, *logged, *(v for v in dict.fromkeys(plan.outputs) if v not in seen)]


def run_debug_bytes(plan: PlanDef, delegate_bytes: int = 0) -> int:
    """Debug-buffer bytes one traced run of ``plan`` stores (the one formula, ``alignment.debug_bytes``): the
    tensors of :func:`logged_values` (a dynamic one at its upper bound), plus ``delegate_bytes``, what its
    delegates declare they log (``PreprocessResult.debug_buffer_bytes``). Emission writes the sum into
    ``PlanDef.debug_buffer_bytes``, which is what the tracer reserves per run."""
    return debug_bytes(value_nbytes(plan, v) for v in logged_values(plan)) + delegate_bytes


@dataclass
class ProgramDef:
    plans: list[PlanDef]
    constants: list[tuple[int, int]]  # (offset, size) in the segment area
    delegate_data: list[tuple[int, int]]
    version: int = PROGRAM_SCHEMA_VERSION
    #: named data (``PreprocessResult.data_store_output``): (key, offset, size) in the segment area, keys unique
    named_data: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def execution_plan(self) -> list[PlanDef]:
        """The methods' plans, under the reference's name (each has ``.name``)."""
        return self.plans

    def plan(self, name: str) -> PlanDef:
        for p in self.plans:
            if p.name == name:
                return p
        raise KeyError(name)

