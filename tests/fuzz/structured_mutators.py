"""Structure-aware mutators (issue 23): each decodes an artifact with the project's own reader, changes ONE field
semantically (an argument index, a shape, stride, offset, size, dtype or placement, an operator, a mutable
buffer's name, an input spec, an ETDump value's dtype/shape/offset/handle, a debug buffer's byte range, an
ETRecord attribute's offset/shape, a reference-graph node's argument...) and re-encodes it with every hash,
manifest and CRC recomputed, so that only the readers' semantic checks can refuse the result.

``mutate_pte(prog, rng)`` edits a decoded ``ProgramDef`` in place; ``mutate_etdump(etdump, rng)`` an ETDump;
``mutate_debug_buffer(etdump, buffer, rng)`` one logged tensor's bytes of a debug buffer (its trailer and the
ETDump's CRC resealed); ``mutate_etrecord(entries, rng)`` one JSON entry of an ETRecord zip (the manifest is
recomputed by the caller). Each returns a short text naming the field and the edit: its prefix before ``:`` is the
mutation's *category*, used to explain a silent change.
"""

from __future__ import annotations

import dataclasses
import json
import random
import zlib

from edgetorch.formats import etdump as ed
from edgetorch.formats import program as pf

# ScalarType codes the formats know (float, half, bfloat16, ints, bool, ...)
DTYPE_CODES = (0, 1, 2, 3, 4, 5, 6, 7, 11, 15)
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int8", "uint8", "bool", "int16")


def int_edit(rng: random.Random, v: int) -> int:
    """Another integer near or far from ``v`` (a semantic edit of a count, index, size or offset)."""
    return rng.choice((v + 1, v - 1, v * 2, v // 2, 0, 1, -1, v + 4, v - 4, v + 64, v + 1024, 1 << 31, 1 << 40))


def _kernel_ins(plan: pf.PlanDef) -> list[int]:
    return [k for k, ins in enumerate(plan.instructions) if ins.call.args or ins.call.outputs]


def _tensors(plan: pf.PlanDef) -> list[int]:
    return [i for i, v in enumerate(plan.values) if isinstance(v, pf.TensorDef)]


def _other_value(rng: random.Random, plan: pf.PlanDef, old: int) -> int:
    """Another value index: most often a tensor of another (or the same) shape, sometimes any or out of range."""
    r = rng.random()
    if r < 0.04:
        return rng.choice((len(plan.values), len(plan.values) + 7, -1, -2))
    tensors = _tensors(plan)
    if r < 0.7 and tensors:
        ov = plan.values[old] if 0 <= old < len(plan.values) else None
        if isinstance(ov, pf.TensorDef) and rng.random() < 0.4:  # same dtype and shape: another valid program
            same = [t for t in tensors if t != old and plan.values[t].scalar_type == ov.scalar_type
                    and list(plan.values[t].sizes) == list(ov.sizes)]
            if same:
                return rng.choice(same)
        return rng.choice(tensors)
    return rng.randrange(len(plan.values))


def _same_type(plan: pf.PlanDef, a: int, b: int) -> bool:
    va = plan.values[a] if 0 <= a < len(plan.values) else None
    vb = plan.values[b] if 0 <= b < len(plan.values) else None
    if isinstance(va, pf.TensorDef) and isinstance(vb, pf.TensorDef):
        return va.scalar_type == vb.scalar_type and list(va.sizes) == list(vb.sizes)
    return type(va) is type(vb)


def _m_arg(rng, prog, plan) -> str:
    ks = [k for k in _kernel_ins(plan) if plan.instructions[k].call.args]
    k = rng.choice(ks)
    c = plan.instructions[k].call
    j = rng.randrange(len(c.args))
    old, new = c.args[j], _other_value(rng, plan, c.args[j])
    c.args[j] = new
    cat = "arg-same-type" if _same_type(plan, old, new) else "arg"
    return f"{cat}: instructions[{k}].args[{j}] {old}->{new}"


def _m_output(rng, prog, plan) -> str:
    ks = [k for k in _kernel_ins(plan) if plan.instructions[k].call.outputs]
    k = rng.choice(ks)
    c = plan.instructions[k].call
    j = rng.randrange(len(c.outputs))
    old, new = c.outputs[j], _other_value(rng, plan, c.outputs[j])
    c.outputs[j] = new
    return f"output: instructions[{k}].outputs[{j}] {old}->{new}"


_PLACEMENTS = {pf.PLACEMENT_PLANNED: "planned", pf.PLACEMENT_CONSTANT: "constant", pf.PLACEMENT_ALIAS: "alias",
               pf.PLACEMENT_DYNAMIC: "dynamic", pf.PLACEMENT_MUTABLE: "mutable"}
_TENSOR_FIELDS = ("sizes", "strides", "storage_offset", "nbytes", "arena_offset", "scalar_type", "placement",
                  "constant_index", "buffer_index", "sym_shape")


def _m_tensor(rng, prog, plan) -> str:
    i = rng.choice(_tensors(plan))
    v = plan.values[i]
    f = rng.choice(_TENSOR_FIELDS)
    what = _PLACEMENTS.get(v.placement, v.placement)
    if f in ("sizes", "strides"):
        items = list(getattr(v, f))
        r = rng.random()
        if items and r < 0.7:
            d = rng.randrange(len(items))
            items[d] = max(int_edit(rng, items[d]), -1) if rng.random() < 0.8 else items[d]
            if rng.random() < 0.3 and len(items) > 1:
                e = rng.randrange(len(items))
                items[d], items[e] = items[e], items[d]
        elif items and r < 0.85:
            items.pop(rng.randrange(len(items)))
        else:
            items.insert(rng.randrange(len(items) + 1), rng.choice((1, 2)))
        setattr(v, f, [int(x) for x in items])
    elif f == "scalar_type":
        v.scalar_type = rng.choice([c for c in DTYPE_CODES if c != v.scalar_type])
    elif f == "placement":
        v.placement = rng.choice([p for p in (pf.PLACEMENT_PLANNED, pf.PLACEMENT_CONSTANT, pf.PLACEMENT_ALIAS,
                                              pf.PLACEMENT_DYNAMIC, pf.PLACEMENT_MUTABLE) if p != v.placement])
    elif f == "arena_offset" and rng.random() < 0.5:
        others = [plan.values[t].arena_offset for t in _tensors(plan) if plan.values[t].arena_offset >= 0]
        v.arena_offset = rng.choice(others) if others else 0
    elif f == "sym_shape":
        if not v.sym_shape:
            return _m_tensor(rng, prog, plan)
        doc = json.loads(v.sym_shape)
        v.sym_shape = json.dumps(_json_leaf_edit(rng, doc))
    else:
        setattr(v, f, max(int_edit(rng, getattr(v, f)), -1))
    return f"tensor-{what}: values[{i}].{f}"


def _m_operator(rng, prog, plan) -> str:
    from edgetorch.formats.operators import allowed_operators

    if not plan.operators:
        return _m_arg(rng, prog, plan)
    i = rng.randrange(len(plan.operators))
    old = plan.operators[i]
    r = rng.random()
    if r < 0.6:  # another allowed op, same overload name when it has it (an out variant for an out call)
        names = _allowed_by_overload(old.overload)
        new = pf.OperatorDef(rng.choice(names), old.overload)
    elif r < 0.8:
        name, overload = rng.choice(sorted(allowed_operators())).rsplit(".", 1)
        new = pf.OperatorDef(name, overload)
    else:
        new = pf.OperatorDef(old.name, rng.choice(("out", "default", "Tensor_out", "Scalar_out", "")))
    plan.operators[i] = new
    return f"op: operators[{i}] {old.name}.{old.overload}->{new.name}.{new.overload}"


_BY_OVERLOAD: dict[str, list[str]] = {}


def _allowed_by_overload(overload: str) -> list[str]:
    from edgetorch.formats.operators import allowed_operators

    if overload not in _BY_OVERLOAD:
        _BY_OVERLOAD[overload] = sorted(n.rsplit(".", 1)[0] for n in allowed_operators()
                                        if n.rsplit(".", 1)[1] == (overload or "default"))
    return _BY_OVERLOAD[overload] or ["aten::add"]


def _m_op_index(rng, prog, plan) -> str:
    ks = [k for k in _kernel_ins(plan) if isinstance(plan.instructions[k].call, pf.KernelCallDef)]
    k = rng.choice(ks)
    c = plan.instructions[k].call
    old = c.op_index
    c.op_index = rng.randrange(len(plan.operators)) if rng.random() < 0.9 else int_edit(rng, old)
    return f"op-index: instructions[{k}].op_index {old}->{c.op_index}"


def _m_kind(rng, prog, plan) -> str:
    ks = [k for k in _kernel_ins(plan) if isinstance(plan.instructions[k].call, pf.KernelCallDef)]
    k = rng.choice(ks)
    c = plan.instructions[k].call
    old = c.kind
    c.kind = rng.choice([x for x in (pf.CALL_OUT, pf.CALL_FUNCTIONAL_COPY, pf.CALL_VIEW, pf.CALL_FUNCTIONAL)
                         if x != old])
    return f"kind: instructions[{k}].kind {old}->{c.kind}"


def _m_scalar(rng, prog, plan) -> str:
    idx = [i for i, v in enumerate(plan.values) if not isinstance(v, pf.TensorDef)]
    if not idx:
        return _m_arg(rng, prog, plan)
    i = rng.choice(idx)
    v = plan.values[i]
    if isinstance(v, bool):
        new = not v
    elif isinstance(v, int):
        new = int_edit(rng, v)
    elif isinstance(v, float):
        new = rng.choice((v * 2, -v, 0.0, v + 1.0, float("nan"), float("inf")))
    elif isinstance(v, (pf.IntListV, pf.DoubleListV, pf.BoolListV, pf.TensorListV, pf.OptionalTensorListV)):
        items = list(v.items)
        if items and rng.random() < 0.75:
            d = rng.randrange(len(items))
            if isinstance(v, pf.BoolListV):
                items[d] = not items[d]
            elif isinstance(v, pf.DoubleListV):
                items[d] = items[d] * 2 + 1
            elif isinstance(v, (pf.TensorListV, pf.OptionalTensorListV)):
                items[d] = _other_value(rng, plan, items[d])
            else:
                items[d] = int_edit(rng, items[d])
        elif items and rng.random() < 0.5:
            items.pop()
        else:
            items.append(items[-1] if items else 1)
        new = dataclasses.replace(v, items=tuple(items))
    elif isinstance(v, pf.DtypeV):
        new = pf.DtypeV(rng.choice(DTYPE_CODES))
    elif isinstance(v, str):
        new = rng.choice(("", v + "x", "mean", "none", "tanh"))
    elif v is None:
        new = rng.choice((0, 1, 1.5, True))
    elif isinstance(v, pf.SymIntV):
        new = pf.SymIntV(json.dumps(_json_leaf_edit(rng, json.loads(v.expr))))
    elif isinstance(v, pf.SymIntListV):
        new = pf.SymIntListV(json.dumps(_json_leaf_edit(rng, json.loads(v.exprs))))
    else:
        new = rng.choice((0, None, 1.0))
    plan.values[i] = new
    return f"scalar: values[{i}] {type(v).__name__}"


def _m_io(rng, prog, plan) -> str:
    f = rng.choice(("inputs", "outputs", "input_names", "output_names", "input_spec", "output_spec"))
    items = getattr(plan, f)
    if f in ("input_spec", "output_spec"):
        try:
            doc = json.loads(items)
        except ValueError:
            return _m_arg(rng, prog, plan)
        setattr(plan, f, json.dumps(_json_leaf_edit(rng, doc)))
        return f"spec: {f}"
    items = list(items)
    if f.endswith("names"):
        if items:
            j = rng.randrange(len(items))
            items[j] = rng.choice(("", items[j] + "_", items[0], "y"))
    elif items and rng.random() < 0.7:
        j = rng.randrange(len(items))
        items[j] = _other_value(rng, plan, items[j])
    elif items and rng.random() < 0.5:
        items.pop(rng.randrange(len(items)))
    else:
        items.append(items[0] if items else 0)
    setattr(plan, f, items)
    return f"io: {f}"


def _m_mutable(rng, prog, plan) -> str:
    if not plan.mutable_buffers:
        return _m_io(rng, prog, plan)
    j = rng.randrange(len(plan.mutable_buffers))
    mb = plan.mutable_buffers[j]
    f = rng.choice(("name", "name", "constant_index", "scalar_type", "sizes"))
    if f == "name":
        new = rng.choice([m.name for m in plan.mutable_buffers] + [mb.name + "_x", ""])
    elif f == "scalar_type":
        new = rng.choice(DTYPE_CODES)
    elif f == "sizes":
        s = list(mb.sizes)
        if s:
            d = rng.randrange(len(s))
            s[d] = max(int_edit(rng, s[d]), 0)
        new = tuple(s)
    else:
        new = max(int_edit(rng, mb.constant_index), -1)
    plan.mutable_buffers[j] = dataclasses.replace(mb, **{f: new})
    return f"mutable: mutable_buffers[{j}].{f}"


def _m_plan(rng, prog, plan) -> str:
    r = rng.random()
    if r < 0.3:
        plan.arena_size = max(int_edit(rng, plan.arena_size), 0)
        return "plan: arena_size"
    if r < 0.45:
        plan.debug_buffer_bytes = max(int_edit(rng, plan.debug_buffer_bytes), 0)
        return "plan: debug_buffer_bytes"
    if r < 0.7 and plan.symbols:
        j = rng.randrange(len(plan.symbols))
        s = plan.symbols[j]
        f = rng.choice(("min", "max", "input", "dim"))
        plan.symbols[j] = dataclasses.replace(s, **{f: max(int_edit(rng, getattr(s, f)), -1)})
        return f"symbol: symbols[{j}].{f}"
    if len(plan.instructions) > 1:
        a = rng.randrange(len(plan.instructions) - 1)
        b = a + 1 if rng.random() < 0.7 else rng.randrange(len(plan.instructions))
        plan.instructions[a], plan.instructions[b] = plan.instructions[b], plan.instructions[a]
        return f"order: instructions {a}<->{b}"
    return _m_arg(rng, prog, plan)


def _m_constants(rng, prog, plan) -> str:
    if not prog.constants:
        return _m_arg(rng, prog, plan)
    j = rng.randrange(len(prog.constants))
    off, size = prog.constants[j]
    if rng.random() < 0.5:
        off = max(int_edit(rng, off), 0) if rng.random() < 0.5 else rng.choice(prog.constants)[0]
    else:
        size = max(int_edit(rng, size), 0)
    prog.constants[j] = (off, size)
    return f"constants: constants[{j}]"


def _m_delegate(rng, prog, plan) -> str:
    dl = [k for k, ins in enumerate(plan.instructions) if isinstance(ins.call, pf.DelegateCallDef)]
    if not dl:
        return _m_arg(rng, prog, plan)
    r = rng.random()
    if r < 0.3:
        c = plan.instructions[rng.choice(dl)].call
        c.delegate_index = int_edit(rng, c.delegate_index)
        return "delegate: delegate_index"
    d = plan.delegates[rng.randrange(len(plan.delegates))]
    if r < 0.5:
        d.data_index = max(int_edit(rng, d.data_index), -1)
        return "delegate: data_index"
    if r < 0.6:
        d.backend_id = rng.choice(("", "XnnpackBackend", d.backend_id + "x"))
        return "delegate: backend_id"
    if d.compile_specs:
        j = rng.randrange(len(d.compile_specs))
        k, val = d.compile_specs[j]
        d.compile_specs[j] = (k, rng.choice((b"", val + b"x", b"1", b"\xff" * 4, val[:-1])))
        return f"delegate-spec: compile_specs[{k}]"
    return _m_arg(rng, prog, plan)


def _m_cosmetic(rng, prog, plan) -> str:
    k = rng.randrange(len(plan.instructions))
    ins = plan.instructions[k]
    if rng.random() < 0.5:
        ins.node_name = ins.node_name + "_x"
        return "cosmetic: node_name"
    ins.debug_handle = int_edit(rng, ins.debug_handle) & 0x7FFFFFFF
    return "cosmetic: debug_handle"


PTE_MUTATORS = ((_m_arg, 22), (_m_output, 6), (_m_tensor, 22), (_m_operator, 8), (_m_op_index, 4), (_m_kind, 3),
                (_m_scalar, 10), (_m_io, 6), (_m_mutable, 4), (_m_plan, 5), (_m_constants, 3), (_m_delegate, 5),
                (_m_cosmetic, 2))


def mutate_pte(prog: pf.ProgramDef, rng: random.Random) -> str:
    """One semantic edit of ``prog`` (in place); returns ``"category: field ..."``."""
    fns, weights = zip(*PTE_MUTATORS)
    plan = rng.choice(prog.plans)
    fn = rng.choices(fns, weights)[0]
    if fn is _m_mutable and not plan.mutable_buffers and rng.random() < 0.8:
        fn = _m_arg
    return fn(rng, prog, plan)


# -- JSON documents (ETRecord entries, specs) ---------------------------------------------------------------------

def _json_paths(doc) -> list[tuple]:
    out: list[tuple] = []

    def walk(x, path):
        out.append(path)
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + (k,))
        elif isinstance(x, list):
            for i, v in enumerate(x[:64]):
                walk(v, path + (i,))
    walk(doc, ())
    return out


def _json_leaf_edit(rng: random.Random, doc, paths: list[tuple] | None = None):
    """``doc`` with one leaf (an int, float, str, bool) given a semantically close value."""
    leaves = [p for p in (paths or _json_paths(doc)) if p and not isinstance(_get(doc, p), (dict, list))]
    if not leaves:
        return doc
    p = rng.choice(leaves)
    parent, key = _get(doc, p[:-1]), p[-1]
    old = parent[key]
    if isinstance(old, bool):
        parent[key] = not old
    elif isinstance(old, int):
        parent[key] = int_edit(rng, old)
    elif isinstance(old, float):
        parent[key] = rng.choice((old * 2, -old, 0.0, old + 1.0))
    elif isinstance(old, str):
        parent[key] = rng.choice(DTYPE_NAMES) if old in DTYPE_NAMES else rng.choice((old + "_", "", "x"))
    else:
        parent[key] = rng.choice((0, 1, "x"))
    return doc


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


# -- ETDump ---------------------------------------------------------------------------------------------------------

def _debug_events(etdump: ed.ETDump) -> list[ed.DebugEvent]:
    return [e.debug_event for r in etdump.run_data for e in r.events if e.debug_event is not None]


def _logged_tensors(etdump: ed.ETDump) -> list[ed.Tensor]:
    out = []
    for d in _debug_events(etdump):
        v = d.debug_entry
        if v.tensor is not None:
            out.append(v.tensor)
        out.extend(v.tensor_list or ())
    return out


def mutate_etdump(etdump: ed.ETDump, rng: random.Random) -> str:
    """One semantic edit of a logged value, an event's identity or the recording's header (in place)."""
    r = rng.random()
    tensors = _logged_tensors(etdump)
    if r < 0.55 and tensors:
        t = rng.choice(tensors)
        f = rng.choice(("scalar_type", "scalar_type", "sizes", "sizes", "strides", "offset", "offset", "nbytes"))
        if f == "scalar_type":
            t.scalar_type = rng.choice([c for c in DTYPE_CODES if c != t.scalar_type])
        elif f in ("sizes", "strides"):
            items = list(getattr(t, f))
            if items and rng.random() < 0.7:
                d = rng.randrange(len(items))
                items[d] = max(int_edit(rng, items[d]), 0)
            elif items and rng.random() < 0.5:
                items.pop()
            else:
                items.append(1)
            setattr(t, f, items)
        elif f == "offset" and rng.random() < 0.5:
            t.offset = rng.choice([x.offset for x in tensors])
        else:
            setattr(t, f, max(int_edit(rng, getattr(t, f)), -1))
        return f"etdump-value: tensor.{f}"
    events = _debug_events(etdump)
    if r < 0.8 and events:
        d = rng.choice(events)
        f = rng.choice(("instruction_id", "chain_index", "output_index", "delegate_debug_id_int", "name", "val"))
        if f == "name":
            d.name = rng.choice(("", d.name + "x", "input:y"))
        elif f == "val":
            v = d.debug_entry
            v.val = rng.choice([x for x in ed.ValueType if x != v.val])
            if v.val == ed.ValueType.Tensor and v.tensor is None:
                v.tensor = ed.Tensor(6, [1], [1], 0, 4)
        else:
            setattr(d, f, max(int_edit(rng, getattr(d, f)), -1))
        return f"etdump-event: debug_event.{f}"
    runs = etdump.run_data
    if r < 0.9 and runs:
        run = rng.choice(runs)
        if len(run.events) > 1 and rng.random() < 0.6:
            a, b = rng.randrange(len(run.events)), rng.randrange(len(run.events))
            run.events[a], run.events[b] = run.events[b], run.events[a]
            return "etdump-order: events swapped"
        if run.events and rng.random() < 0.5:
            run.events.pop(rng.randrange(len(run.events)))
            return "etdump-order: event dropped"
        run.method = rng.choice(("", "forward", "encode", run.method + "x"))
        return "etdump-run: method"
    f = rng.choice(("program_hash", "debug_buffer_bytes", "run_id", "version"))
    if f == "program_hash":
        etdump.program_hash = etdump.program_hash[:-1] + ("0" if etdump.program_hash[-1:] != "0" else "1")
    elif f == "run_id":
        etdump.run_id = "00" * 16
    else:
        setattr(etdump, f, max(int_edit(rng, getattr(etdump, f)), 0))
    return f"etdump-header: {f}"


# -- debug buffer -----------------------------------------------------------------------------------------------

def mutate_debug_buffer(etdump: ed.ETDump, buffer: bytes, rng: random.Random) -> tuple[bytes, str]:
    """``buffer`` with one logged tensor's byte range edited (values, or the range cut off), resealed: the trailer
    and ``etdump.debug_buffer_crc32`` / ``debug_buffer_bytes`` match the new data (``etdump`` edited in place)."""
    trailer = ed.read_trailer(buffer, len(buffer))
    data = bytearray(buffer[:len(buffer) - ed.TRAILER_SIZE] if trailer else buffer)
    tensors = [t for t in _logged_tensors(etdump) if t.offset >= 0 and t.nbytes > 0
               and t.offset + t.nbytes <= len(data)]
    t = rng.choice(tensors)
    item = max(t.dtype.itemsize, 1)
    r = rng.random()
    if r < 0.1:
        del data[t.offset:]
        what = "debug-range: cut at a tensor's start"
    elif r < 0.25:
        others = [o for o in tensors if o.nbytes == t.nbytes and o.offset != t.offset]
        if others:
            o = rng.choice(others)
            data[t.offset:t.offset + t.nbytes] = data[o.offset:o.offset + o.nbytes]
            what = "debug-values: copied from another tensor"
        else:
            data[t.offset:t.offset + t.nbytes] = bytes(t.nbytes)
            what = "debug-values: zeroed"
    elif r < 0.35:
        data[t.offset:t.offset + t.nbytes] = bytes(t.nbytes)
        what = "debug-values: zeroed"
    else:
        e = rng.randrange(max(t.nbytes // item, 1)) * item
        pat = rng.choice((b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\xff\xff\xff\xff", b"\x00\x00\x80\x3f"))
        data[t.offset + e:t.offset + e + item] = (pat * 4)[:item]
        what = "debug-values: one element"
    crc = zlib.crc32(data)
    etdump.debug_buffer_crc32 = crc
    etdump.debug_buffer_bytes = len(data)
    if trailer is not None:
        data += ed.encode_trailer(ed.DebugBufferTrailer(len(data), trailer.program_hash, trailer.run_id, crc))
    return bytes(data), what


# -- ETRecord ---------------------------------------------------------------------------------------------------

def _tensor_descs(doc) -> list[dict]:
    return [_get(doc, p) for p in _json_paths(doc) if p and p[-1] == "tensor" and isinstance(_get(doc, p), dict)]


def _edit_tensor_desc(rng: random.Random, t: dict, all_descs: list[dict]) -> str:
    f = rng.choice(("offset", "offset", "shape", "shape", "dtype", "strides", "nbytes"))
    if f == "offset":
        t[f] = rng.choice((t[f] + 1, t[f] + 4, t[f] - 4, t[f] + 64, rng.choice(all_descs).get("offset", 0), -1))
    elif f == "dtype":
        t[f] = rng.choice([d for d in DTYPE_NAMES if d != t.get(f)])
    elif f in ("shape", "strides") and t.get(f):
        items = list(t[f])
        d = rng.randrange(len(items))
        if rng.random() < 0.3 and len(items) > 1:
            e = rng.randrange(len(items))
            items[d], items[e] = items[e], items[d]
        else:
            items[d] = max(int_edit(rng, items[d]), 0)
        t[f] = items
    else:
        t[f] = max(int_edit(rng, t.get(f, 0)), 0)
    return f


def _edit_node(rng: random.Random, doc: dict) -> str:
    from edgetorch.formats.operators import allowed_operators

    nodes = doc["nodes"]
    calls = [n for n in nodes if n.get("op") == "call_function"]
    n = rng.choice(calls)
    r = rng.random()
    if r < 0.4 and n.get("args"):
        refs = [i for i, a in enumerate(n["args"]) if isinstance(a, dict) and "node" in a]
        if refs:
            i = rng.choice(refs)
            n["args"][i] = {"node": rng.choice(nodes)["name"]}
            return "ref-node: args (node moved)"
        i = rng.randrange(len(n["args"]))
        n["args"][i] = _json_leaf_edit(rng, {"v": n["args"][i]})["v"]
        return "ref-node: args (literal)"
    if r < 0.65:
        old = n["target"]
        overload = old.rsplit(".", 1)[1]
        same = [x for x in allowed_operators() if x.rsplit(".", 1)[1] == overload]
        n["target"] = rng.choice(sorted(same) or ["aten::relu.default"])
        return "ref-op: target"
    val = n.get("meta", {}).get("val")
    if isinstance(val, dict):
        if rng.random() < 0.5 and "dtype" in val:
            val["dtype"] = rng.choice(DTYPE_NAMES)
        elif val.get("shape"):
            d = rng.randrange(len(val["shape"]))
            val["shape"][d] = max(int_edit(rng, val["shape"][d]), 0)
        return "ref-meta: val"
    n.setdefault("meta", {}).setdefault("custom", {})["debug_handle"] = rng.randrange(1, 9)
    return "ref-meta: debug_handle"


def mutate_etrecord(entries: dict[str, bytes], rng: random.Random) -> str:
    """One semantic edit of one JSON entry of an ETRecord (``entries``: name -> bytes, edited in place)."""
    names = sorted(n for n in entries if n.endswith(".json") and n != "manifest.json")
    graphs = [n for n in names if n.startswith(("reference/", "edge_reference/")) and not n.endswith("index.json")]
    with_tensors = [n for n in names if b'"tensor"' in entries[n]]
    r = rng.random()
    if r < 0.35 and graphs:
        name = rng.choice(graphs)
        doc = json.loads(entries[name])
        what = _edit_node(rng, doc)
    elif r < 0.7 and with_tensors:
        name = rng.choice(with_tensors)
        doc = json.loads(entries[name])
        descs = _tensor_descs(doc)
        f = _edit_tensor_desc(rng, rng.choice(descs), descs)
        what = f"attr-{f}: tensor.{f}"
    else:
        name = rng.choice(names)
        doc = json.loads(entries[name])
        doc = _json_leaf_edit(rng, doc)
        what = "json-leaf: one leaf"
    entries[name] = json.dumps(doc).encode()
    return f"{what} in {name}"
