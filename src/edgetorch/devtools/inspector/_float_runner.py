"""The float runner of the float reference (``inspector.float_reference``): one generated module per set of rows
runs the float graph twice in one call, on the float values (the accumulated reference) and on the runtime's
values (the local reference), and reduces the sums of squares the table needs; ``Inject`` runs the float graph
with some ops' outputs shifted by noise."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

__all__ = ["Inject", "JointRunner", "flat_cat", "float_leaves", "mutable", "sum_sq"]


def mutable(n: torch.fx.Node) -> bool:
    return isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable


def _functional(op: Any) -> Any:
    """The out-of-place twin of an in-place ATen op (``aten.hardtanh_.default`` -> ``aten.hardtanh.default``),
    or None."""
    name = getattr(op, "_schema", None) and op._schema.name
    if not name or not name.startswith("aten::") or not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(torch.ops.aten, name[len("aten::"):-1], None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    if twin is None or twin._schema.is_mutable or len(twin._schema.arguments) != len(op._schema.arguments):
        return None
    return twin


def _joint_module(fgm: torch.fx.GraphModule, row_nodes: tuple[torch.fx.Node, ...],
                  input_index: tuple[int, ...], with_float: bool = True) -> torch.fx.GraphModule:
    """A generated module that runs the float graph twice in one call: on the float values (the accumulated
    reference) and on the runtime's values (the local reference: each op fed the runtime's values of its inputs,
    the runtime value substituted at every row). Its inputs: the user inputs, the runtime's dequantized inputs
    (``input_index``), then the runtime value of each row; it returns (float, local) per row, or only the local
    values without ``with_float`` (the float pass then computes only what the local one reads). Generated Python
    code, not an interpreter: small models pay no per-node dispatch overhead."""
    g = torch.fx.Graph()
    ref: dict[torch.fx.Node, torch.fx.Node] = {}
    rt: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = [n for n in fgm.graph.nodes if n.op == "placeholder"]
    for p in placeholders:
        ref[p] = g.placeholder(p.name)
    for i in input_index:
        rt[placeholders[i]] = g.placeholder(f"runtime_input_{i}")
    row_inputs = {n: g.placeholder(f"runtime_{n.name}") for n in row_nodes}
    outs: list[torch.fx.Node] = []

    def call(n: torch.fx.Node, env: Any) -> torch.fx.Node:
        args = torch.fx.node.map_arg(n.args, env)
        kwargs = torch.fx.node.map_arg(n.kwargs, env)
        functional = _functional(n.target) if mutable(n) else None
        if functional is not None:  # relu_ -> relu: the same values, no write into values other rows read
            return g.call_function(functional, args, kwargs)
        if mutable(n):  # never write into values other rows still read
            clone = torch.ops.aten.clone.default
            args = torch.fx.node.map_arg(args, lambda a: g.call_function(clone, (a,)))
            kwargs = torch.fx.node.map_arg(kwargs, lambda a: g.call_function(clone, (a,)))
        return g.call_function(n.target, args, kwargs)

    for n in fgm.graph.nodes:
        if n.op == "get_attr":
            ref[n] = g.get_attr(n.target)
        if n.op != "call_function":
            continue
        ref[n] = call(n, ref.__getitem__)
        differs = any(a in rt for a in n.all_input_nodes)
        local = call(n, lambda a: rt.get(a, ref[a])) if differs else ref[n]
        if n in row_inputs:
            outs += [ref[n], local] if with_float else [local]
            rt[n] = row_inputs[n]
        elif differs:
            rt[n] = local
    g.output(tuple(outs))
    # drop what no returned value reads (without ``with_float``, the float pass the local one does not read; with
    # it, e.g. the ops after the last row): every op is pure here (in-place ops made out-of-place or run on clones;
    # an inference dropout is the identity)
    g.eliminate_dead_code(is_impure_node=lambda n: n.op in ("placeholder", "output"))
    return torch.fx.GraphModule(fgm, g)


_STACKED = 1024  # rows up to this many elements are reduced stacked (larger ones: stacking costs more)


def _pair_sums(vals: list[torch.Tensor], rts: list[torch.Tensor]) -> list[list[float]]:
    """Per row, [Σval², Σ(val − runtime)²]. Small float32 rows of one size are stacked and reduced together (a
    handful of calls per size instead of four per row: the per-call cost dominates on small models); the others
    row by row (float32 dot products, float64 for other dtypes)."""
    out: list[list[float]] = [[] for _ in vals]
    by_size: dict[int, list[int]] = {}
    for i, t in enumerate(vals):
        if t.dtype == torch.float32 and t.numel() <= _STACKED:
            by_size.setdefault(t.numel(), []).append(i)
    for size, idx in by_size.items():
        if len(idx) < 2:
            continue
        v, x = (torch.stack([ts[i].reshape(size) for i in idx]) for ts in (vals, rts))
        sq = torch.stack([v, v - x]).square_().sum(-1).T.tolist()
        for i, row in zip(idx, sq):
            out[i] = row
    rest = [i for i, row in enumerate(out) if not row]
    dots = []  # 0-d float32 tensors, converted together at the end (one call, the same values)
    for i in rest:
        v, x = vals[i], rts[i]
        if v.dtype == x.dtype == torch.float32:
            flat, diff = v.reshape(-1), (v - x).reshape(-1)
            dots += [torch.dot(flat, flat), torch.dot(diff, diff)]
        else:
            out[i] = [sum_sq(v), sum_sq(v - x)]
    sums = iter(torch.stack(dots).tolist() if dots else [])
    for i in rest:
        if not out[i]:
            out[i] = [next(sums), next(sums)]
    return out


_FLOAT_CACHE_BYTES = 512 << 20  # the float values of the rows kept per Inspector for later tables


class JointRunner:
    """Builds (and caches, per set of rows) the joint module and runs it on one sample. The float values of a
    recorded sample's rows depend only on the float program and that input: they are kept (up to
    ``_FLOAT_CACHE_BYTES``), and a later table of the same Inspector runs only the local pass."""

    def __init__(self, fgm: torch.fx.GraphModule) -> None:
        self.fgm = fgm
        self.cache: dict[tuple, torch.fx.GraphModule] = {}
        self.placeholders = [n for n in fgm.graph.nodes if n.op == "placeholder"]
        self.floats: dict[tuple, list[torch.Tensor]] = {}
        self.float_bytes = 0

    def _module(self, key: tuple, with_float: bool) -> torch.fx.GraphModule:
        module = self.cache.get((*key, with_float))
        if module is None:
            module = self.cache[(*key, with_float)] = _joint_module(self.fgm, *key, with_float=with_float)
        return module

    def run(self, inputs: list[Any], runtime_inputs: dict[int, torch.Tensor],
            rows: dict[torch.fx.Node, torch.Tensor], sample: Any = None
            ) -> dict[torch.fx.Node, tuple[torch.Tensor, torch.Tensor, list[float]]]:
        """Per row: (float value, local value, [Σref², Σ(ref − rt)², Σlocal², Σ(local − rt)²]). ``sample``: a key
        of the recorded input (None: nothing kept)."""
        return self.run_all([(inputs, runtime_inputs, rows, sample)])[0]

    def run_all(self, batch: list[tuple]) -> list[dict[torch.fx.Node, tuple[torch.Tensor, torch.Tensor, list[float]]]]:
        """:meth:`run` on every (inputs, runtime inputs, rows, sample) of ``batch``, the sums of all of them
        reduced together (fewer, larger calls); the float values' sums of a kept sample are kept with them."""
        done = [self._values(*item) for item in batch]
        fresh = [(j, k) for j, d in enumerate(done) if d[4] is None for k in range(len(d[0]))]
        every = [(j, k) for j, d in enumerate(done) for k in range(len(d[0]))]
        float_sums = dict(zip(fresh, _pair_sums([done[j][1][k] for j, k in fresh], [done[j][3][k] for j, k in fresh])))
        local_sums = dict(zip(every, _pair_sums([done[j][2][k] for j, k in every], [done[j][3][k] for j, k in every])))
        out = []
        for j, (row_nodes, floats, locs, _, kept, key) in enumerate(done):
            if kept is None:
                kept = [float_sums[(j, k)] for k in range(len(row_nodes))]
                if key in self.floats:
                    self.floats[key] = (floats, kept)
            out.append({n: (floats[k], locs[k], [*kept[k], *local_sums[(j, k)]]) for k, n in enumerate(row_nodes)})
        return out

    def _values(self, inputs: list[Any], runtime_inputs: dict[int, torch.Tensor],
                rows: dict[torch.fx.Node, torch.Tensor], sample: Any) -> tuple:
        """(row nodes, float values, local values, runtime values, the kept [Σref², Σ(ref − rt)²] per row or
        None, the key of the kept float values)."""
        row_nodes = tuple(n for n in self.fgm.graph.nodes if n in rows)
        index = tuple(i for i in sorted(runtime_inputs) if i < len(self.placeholders))
        args = [*inputs, *[runtime_inputs[i] for i in index], *[rows[n] for n in row_nodes]]
        key = (sample, row_nodes)
        kept = self.floats.get(key) if sample is not None else None
        if kept is not None and kept[1] is not None:  # the float values and their sums (no local value in them)
            floats, float_sums = kept
            locs = list(self._module((row_nodes, index), False)(*args))
        else:
            out = self._module((row_nodes, index), True)(*args)
            floats, locs, float_sums = list(out[0::2]), list(out[1::2]), None
            size = sum(t.numel() * t.element_size() for t in floats)
            if sample is not None and key not in self.floats and self.float_bytes + size <= _FLOAT_CACHE_BYTES:
                self.floats[key] = (floats, None)  # run_all adds their sums
                self.float_bytes += size
        return row_nodes, floats, locs, [rows[n] for n in row_nodes], float_sums, key


class Inject(torch.fx.Interpreter):
    """The float graph with some ops' outputs shifted by noise tensors."""

    def __init__(self, gm: torch.fx.GraphModule, noises: dict[torch.fx.Node, torch.Tensor]) -> None:
        super().__init__(gm)
        self.noises = noises

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_function" and mutable(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            args, kwargs = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))
            out = self.call_function(n.target, args, kwargs)
        else:
            out = super().run_node(n)
        noise = self.noises.get(n)
        return out if noise is None else out + noise


def sum_sq(x: torch.Tensor) -> float:
    """The sum of squares of ``x`` (a float32 dot product, accumulated in float64 for other dtypes)."""
    flat = x.reshape(-1)
    if flat.dtype != torch.float32:
        flat = flat.double()
    return float(torch.dot(flat, flat))


def flat_cat(tree: Any) -> torch.Tensor:
    leaves = [t.reshape(-1) for t in float_leaves(tree)]
    return torch.cat(leaves) if leaves else torch.zeros(0)


def float_leaves(tree: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]
