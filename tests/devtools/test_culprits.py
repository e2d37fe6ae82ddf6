"""Scale-aware gaps and culprits: relative errors against numpy, the noise model, the multi-output local-gap fix,
no culprit on clean programs (portable and ORT, zoo and Hugging Face), planted faults found at their op (down to
1e-5 of a tensor's std), and the DELEGATE_CALL row never outranking the inner row of the delegate's last op."""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import numpy as np
import pytest
import torch

from edgetorch.devtools.inspector import MSEComparator
from edgetorch.devtools.inspector.culprits import find_culprits
from edgetorch.devtools.inspector.noise import (
    C_ELEMENT,
    C_REDUCE,
    DELEGATE_FACTOR,
    floor_from_units,
    op_noise,
    rel_error,
    unit_roundoff,
    verdict,
)
from edgetorch.devtools.inspector.numeric_gap import RuntimeEntry, compute_numeric_gap
from edgetorch.errors import InspectorError
from edgetorch.formats.handles import IN_DELEGATE, HandleGroup

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench():
    spec = importlib.util.spec_from_file_location("bench_culprits", os.path.join(ROOT, "bench", "bench_culprits.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_culprits"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


B = _bench()
_PROGRAMS: dict[tuple[str, str], object] = {}  # one export per (family, backend), shared by this module's tests


@pytest.fixture(autouse=True, scope="module")
def _release_programs():
    yield
    _PROGRAMS.clear()


def _program(family: str, backend: str):
    """``B.export(family, backend)`` once per module: the tests only read the program (a planted fault is written
    into a copy of its bytes, a kernel fault into the loaded method), as each test already does site after site."""
    if (family, backend) not in _PROGRAMS:
        _PROGRAMS[family, backend] = B.export(family, backend)
    return _PROGRAMS[family, backend]


def test_rel_error_and_unit_roundoff_against_numpy():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, generator=g)
    b = a + 1e-3 * torch.randn(50, generator=g)
    an, bn = a.double().numpy(), b.double().numpy()
    assert rel_error(a, b) == pytest.approx(np.linalg.norm(bn - an) / np.linalg.norm(an), rel=1e-12)
    assert rel_error(a, a.clone()) == 0.0
    assert rel_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert rel_error(torch.zeros(3), torch.ones(3)) > 1e30  # nothing to normalise by: tiny denominator
    assert rel_error(torch.arange(3), torch.arange(3)) is None  # integer rows are compared exactly
    assert unit_roundoff(torch.float32) == 2.0 ** -24
    assert unit_roundoff(torch.float16) == 2.0 ** -11
    assert unit_roundoff(torch.int64) == 0.0


def test_noise_floor_grows_with_reduction_length_and_delegation():
    u = 2.0 ** -24
    mm = torch.ops.aten.mm.default
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    node = graph.call_function(mm, (x, w))
    k64 = op_noise(node, u, (torch.zeros(2, 64), torch.zeros(64, 3)))
    k4096 = op_noise(node, u, (torch.zeros(2, 4096), torch.zeros(4096, 3)))
    assert k64 == pytest.approx(u * (C_ELEMENT + C_REDUCE * 8))
    assert k4096 == pytest.approx(u * (C_ELEMENT + C_REDUCE * 64))
    view = graph.call_function(torch.ops.aten.view.default, (node, [6]))
    assert op_noise(view, u, (torch.zeros(2, 3), [6])) == 0.0  # moving elements rounds nothing
    assert floor_from_units(10.0, torch.float32, True) == pytest.approx(10 * u * DELEGATE_FACTOR)
    assert floor_from_units(10.0, torch.float16, False) == pytest.approx(10 * 2.0 ** -11)
    assert floor_from_units(10.0, torch.int32, False) is None
    assert verdict(0.0, 1e-6, False, 0.0) == "exact"
    assert verdict(1e-7, 1e-6, False, 1e-14) == "noise"
    assert verdict(1e-5, 1e-6, False, 1e-10) == "real"
    assert verdict(None, None, True, 0.0) == "exact" and verdict(None, None, True, 0.25) == "real"


# -- (b) the local gap of ops downstream of a multi-output op whose runtime logs some of its outputs ------------
class _QKV(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        qkv = torch.ops.aten.mm.default(x, w).reshape(4, 3, 8).permute(1, 0, 2)
        q, k, v = torch.ops.aten.unbind.int(qkv)
        return torch.ops.aten.add.Tensor(torch.ops.aten.mul.Tensor(q, k), v)


def _qkv_graph():
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    w = torch.randn(16, 24, generator=torch.Generator().manual_seed(2))
    gm = torch.export.export(_QKV(), (x, w)).module()
    handles = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and hasattr(n.target, "_schema"):
            name = n.target._schema.name.split("::")[-1]
            h = {"mm": 1, "unbind": 2, "mul": 3, "add": 4}.get(name)
            if h is not None:
                n.meta.setdefault("custom", {})["debug_handle"] = h
                handles[name] = n
    return gm, (x, w), handles


def _delegated(h: int, ops: str, value, iid: int = 0) -> RuntimeEntry:
    return RuntimeEntry(HandleGroup(IN_DELEGATE, iid, (h,), ops, "onnxruntime"), [ops], value)


@pytest.mark.parametrize("logged", ["all", "one"])
def test_multi_output_op_every_logged_output_substituted_and_missing_ones_not_charged(logged):
    gm, (x, w), _ = _qkv_graph()
    mm = x @ w
    bad = mm + 1e-2 * mm.std()  # the runtime's mm is wrong: the error belongs to mm alone
    q, k, v = bad.reshape(4, 3, 8).permute(1, 0, 2).unbind(0)
    out = q * k + v
    unbind_value = [v, q, k] if logged == "all" else [q]  # a delegate logs them in no particular order
    entries = [_delegated(1, "mm", bad), _delegated(2, "split", unbind_value), _delegated(3, "mul", q * k),
               _delegated(4, "add", out)]
    df, cov = compute_numeric_gap(gm, (x, w), entries, MSEComparator())
    by_op = {r["aot_ops"][-1]: r for _, r in df.iterrows()}
    assert by_op["mm"]["verdict"] == "real"
    assert by_op["mm"]["local_rel_error"] == pytest.approx(rel_error(mm, bad), rel=1e-9)
    for op in ("mul", "add"):  # downstream ops see the runtime's (wrong) inputs: they add nothing themselves
        assert by_op[op]["verdict"] in ("exact", "noise"), (op, by_op[op]["local_rel_error"])
        assert by_op[op]["rel_error"] > 1e-4  # while their accumulated error is large
    cul = find_culprits(df, top=5)
    assert [c[-1] for c in cul["aot_ops"]] == ["mm"]


def test_multi_output_before_the_fix_would_have_charged_the_downstream_op():
    """Independent check of what the walk must avoid: re-running ``mul`` on the runtime's q but the reference's
    k differs from the runtime's ``q * k`` by far more than noise."""
    _, (x, w), _ = _qkv_graph()
    mm = x @ w
    bad = mm + 1e-2 * mm.std()
    q_rt, k_rt, _ = bad.reshape(4, 3, 8).permute(1, 0, 2).unbind(0)
    _, k_ref, _ = mm.reshape(4, 3, 8).permute(1, 0, 2).unbind(0)
    assert rel_error(q_rt * k_ref, q_rt * k_rt) > 1e-4


# -- whole programs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,backend", [("mlp", "portable"), ("mlp", "ort"), ("vit_tiny", "portable"),
                                            ("vit_tiny", "ort"), ("bert", "ort"), ("gpt2", "portable")])
def test_clean_fp32_programs_name_no_culprit(family, backend):
    pytest.importorskip("transformers") if family in B.HF else None
    prog = _program(family, backend)
    insp, df = B.debug_run(prog, prog.pte)
    assert insp.find_culprits(df, top=100).empty
    assert set(df["verdict"]) <= {"exact", "noise"}
    assert df.attrs["noise_model"]["DELEGATE_FACTOR"] == DELEGATE_FACTOR
    # the scale columns against an independent computation
    for _, r in df.iterrows():
        if r["dtype"] != "float32":
            continue
        a = r["aot_intermediate_output"].detach().double().numpy().ravel()
        b = r["runtime_intermediate_output"].detach().double().numpy().ravel()
        want = np.linalg.norm(b - a) / max(np.linalg.norm(a), np.finfo(np.float32).tiny)
        assert r["rel_error"] == pytest.approx(want, rel=1e-9, abs=1e-300)
        assert r["noise_floor"] >= C_ELEMENT * 2.0 ** -24 * (1 if r["delegate"] is None else DELEGATE_FACTOR) - 1e-18


@pytest.mark.parametrize("family,backend", [("mlp", "portable"), ("mlp", "ort"), ("vit_tiny", "ort"),
                                            ("small_cnn", "portable")])
@pytest.mark.parametrize("size", [1e-3, 1e-5])
def test_planted_weight_fault_is_the_first_culprit(family, backend, size):
    prog = _program(family, backend)
    sites = B.weight_sites(prog, 2)
    assert sites
    for site in sites:
        insp, df = B.debug_run(prog, B.perturb_weights(prog, [site], size))
        cul = insp.find_culprits(df, top=3)
        assert len(cul) >= 1, (site, df[["aot_ops", "local_rel_error", "noise_floor"]])
        assert set(cul.iloc[0]["aot_ops"]) & prog.consumers[site], (site, cul[["aot_ops", "local_rel_error"]])
        assert cul.iloc[0]["runtime_ops"] != ["DELEGATE_CALL"]


def test_fault_at_the_delegates_last_op_names_the_inner_row_not_the_delegate_call():
    prog = _program("mlp", "ort")
    last = "fc3.weight"  # fc3 is the delegate's last op: its output is the DELEGATE_CALL's output
    insp, df = B.debug_run(prog, B.perturb_weights(prog, [last], 1e-3))
    delegate_rows = df[[ops == ["DELEGATE_CALL"] for ops in df["runtime_ops"]]]
    assert len(delegate_rows) and (delegate_rows["verdict"] == "real").all()  # it shows the error too ...
    cul = insp.find_culprits(df, top=5)
    assert len(cul) == 1 and cul.iloc[0]["runtime_ops"] != ["DELEGATE_CALL"]  # ... but is not a separate culprit
    assert set(cul.iloc[0]["aot_ops"]) & prog.consumers[last]
    for col in ("gap", "local_gap", "rel_error", "local_rel_error", "noise_ratio", "accumulated_rank",
                "in_delegate_call", "source", "module"):
        assert col in cul.columns
    assert "fc3" in cul.iloc[0]["module"] and "mlp.py" in cul.iloc[0]["source"]


def test_kernel_faults_input_dependent_and_two_at_once():
    prog = _program("small_cnn", "portable")
    for k in B.kernel_sites(prog, 2):
        for dep in (False, True):
            insp, df = B.debug_run(prog, prog.pte, B.kernel_patch(k, 1e-4, input_dependent=dep))
            cul = insp.find_culprits(df, top=3)
            assert int(cul.iloc[0]["instruction_id"]) == k
    w = B.weight_sites(prog, 2)
    insp, df = B.debug_run(prog, B.perturb_weights(prog, w, 1e-3))
    cul = insp.find_culprits(df, top=3)
    found = [site for site in w if any(set(ops) & prog.consumers[site] for ops in cul["aot_ops"])]
    assert found == w


def test_find_culprits_arguments_are_checked():
    prog = _program("mlp", "portable")
    _, df = B.debug_run(prog, prog.pte)
    with pytest.raises(InspectorError, match="top"):
        find_culprits(df, top=-1)
    with pytest.raises(InspectorError, match="lacks the columns"):
        find_culprits(df.drop(columns=["noise_floor"]))
    assert math.isfinite(df["noise_floor"].dropna().astype(float).max())


def test_fault_below_ort_noise_in_absolute_terms_is_judged_on_the_relative_scale(monkeypatch):
    """(c): the final linear of an ORT program works on values a million times smaller than the convolutions';
    a fault of 1e-3 of its weight's std is far below the convolutions' ORT-vs-ATen round-off in MSE, yet it is
    the only op adding error beyond its noise floor."""
    from edgetorch.models import get_model

    def tiny_head(family):
        model, inputs = get_model("small_cnn")
        with torch.no_grad():
            model.fc.weight.mul_(1e-6)
            model.fc.bias.mul_(1e-6)
        return model, inputs

    monkeypatch.setattr(B, "build", tiny_head)
    prog = B.export("small_cnn_tiny_head", "ort")
    insp, df = B.debug_run(prog, B.perturb_weights(prog, ["fc.weight"], 1e-3))
    cul = insp.find_culprits(df, top=3)
    assert len(cul) == 1 and set(cul.iloc[0]["aot_ops"]) & prog.consumers["fc.weight"]
    row = cul.iloc[0]
    assert row["local_rel_error"] > 10 * row["noise_floor"]
    # in absolute terms the fault is smaller than what the convolutions' rounding makes (when ORT rounds
    # differently from ATen on this machine): the MSE ranking would not put it first
    convs = [lg[0] for ops, lg in zip(df["aot_ops"], df["local_gap"]) if ops[0].startswith("conv")]
    if max(convs) > row["local_gap"][0]:
        by_mse = max(zip(df["local_gap"], df.index), key=lambda t: t[0][0] or 0.0)[1]
        assert by_mse != row.name
