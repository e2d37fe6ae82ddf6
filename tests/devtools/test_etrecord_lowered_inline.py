"""An ETRecord of a *lowered* edge program (the seeds' flow: ``to_edge_transform_and_lower`` without
``generate_etrecord``, then ``generate_etrecord(path, edge, et)``) stores its edge reference graph and handle
table flat, each delegate call inlined: no warning on write or read, the Inspector links the rows inside the ONNX
Runtime delegate to the partition's edge ops, and the gaps are those of the ``et.get_etrecord()`` record."""

from __future__ import annotations

import copy
import logging
import os

import pytest
import torch

from edgetorch.backends.onnxruntime import OrtPartitioner
from edgetorch.devtools import Inspector, generate_etrecord
from edgetorch.devtools.etrecord import parse_etrecord
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.exir.backend import lowered_module_of
from edgetorch.exir.backend.lowered import delegate_calls, inline_lowered_modules
from edgetorch.runtime import Runtime


def _models() -> dict[str, tuple[torch.nn.Module, tuple]]:
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 3))
    return {"linear": (torch.nn.Linear(4, 3), (torch.randn(2, 4),)),
            "sequential": (torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
                           (torch.randn(2, 4),)),
            "cnn": (cnn, (torch.randn(1, 3, 8, 8),))}


def _gaps(m: torch.nn.Module, x: tuple, tmp: str, seeds_flow: bool):
    """(Inspector, gap table, lowered module) of the program of ``m``, recorded by the seeds' flow or by
    ``generate_etrecord=True`` / ``et.get_etrecord()``."""
    edge = to_edge_transform_and_lower(torch.export.export(m.eval(), x), partitioner=[OrtPartitioner()],
                                       generate_etrecord=not seeds_flow)
    et = copy.deepcopy(edge).to_executorch()
    d = os.path.join(tmp, "seeds" if seeds_flow else "gen")
    os.makedirs(d)
    rec = os.path.join(d, "r.bin")
    if seeds_flow:
        generate_etrecord(rec, edge, et)
    else:
        et.get_etrecord().save(rec)
    parsed = parse_etrecord(rec)
    parsed.update_representative_inputs(x)
    parsed.save(rec)
    et.save(os.path.join(d, "m.pte"))
    p = Runtime.get().load_program(os.path.join(d, "m.pte"), enable_etdump=True, debug_buffer_size="auto")
    p.load_method("forward").execute(*x)
    p.write_etdump_result_to_file(os.path.join(d, "e.etdp"), os.path.join(d, "b.bin"))
    ins = Inspector(etdump_path=os.path.join(d, "e.etdp"), etrecord=rec, debug_buffer_path=os.path.join(d, "b.bin"))
    lowered = lowered_module_of(delegate_calls(edge.exported_program())[0])
    return ins, ins.calculate_numeric_gap(), lowered


def _flat(col) -> list[float]:
    return [float(v) for g in col for v in (g if isinstance(g, (list, tuple)) else [g])]


@pytest.mark.parametrize("name", ["linear", "sequential", "cnn"])
def test_seeds_flow_record_is_quiet_and_links_the_delegate(name, tmp_path, caplog):
    m, x = _models()[name]
    caplog.set_level(logging.DEBUG, logger="edgetorch")
    ins, df, lowered = _gaps(m, x, str(tmp_path), seeds_flow=True)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not loud, [r.getMessage() for r in loud]
    # the handle table lists the partition's edge ops (not the delegate call), by their handles
    table = ins._etrecord.handle_table("forward")
    part = {n.name: n.meta["custom"]["debug_handle"] for n in lowered.original_module.graph.nodes
            if n.op == "call_function" and (n.meta.get("custom") or {}).get("debug_handle")}
    assert {(i.name, h) for h, infos in table.items() for i in infos} == {(k, h) for k, h in part.items()}
    inside = df[df["kind"] == "in_delegate"]
    assert len(inside) >= 1 and all(len(ops) >= 1 for ops in inside["aot_ops"])
    assert {int(h) for hs in inside["aot_debug_handle"] for h in (hs if isinstance(hs, tuple) else (hs,))} \
        <= set(part.values())
    assert len(ins.find_culprits(df)) == 0
    # the same gaps as the generate_etrecord=True record of the same program
    _, ref, _ = _gaps(m, x, str(tmp_path), seeds_flow=False)
    assert list(df["aot_ops"]) == list(ref["aot_ops"]) and list(df["kind"]) == list(ref["kind"])
    assert _flat(df["gap"]) == pytest.approx(_flat(ref["gap"]), rel=1e-4, abs=1e-9) and _flat(df["gap"])


def test_inlined_graph_computes_the_lowered_program():
    """The flat graph (partition state lifted as inputs) gives the eager module's output; a program without
    delegate calls is returned as it is."""
    m, x = _models()["sequential"]
    edge = to_edge_transform_and_lower(torch.export.export(m.eval(), x), partitioner=[OrtPartitioner()])
    ep = edge.exported_program()
    flat = inline_lowered_modules(ep)
    assert not delegate_calls(flat.graph) and delegate_calls(ep)  # ep untouched
    specs = flat.graph_signature.input_specs
    args = [x[0] if s.kind.name == "USER_INPUT" else flat.state_dict[s.target] for s in specs]
    (out,) = flat.graph_module(*args)
    torch.testing.assert_close(out, m(*x))
    plain = to_edge_transform_and_lower(torch.export.export(m, x)).exported_program()
    assert inline_lowered_modules(plain) is plain
