"""Hugging Face text/vision models (small configs, fixed-seed random weights) through export -> lowering (portable
and ONNX Runtime) -> .pte -> ETRecord save/parse -> Inspector gap table, every row checked independently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import ETRecordFormatError, ForeignContainer, parse_etrecord
from edgetorch.devtools.inspector.comparators import EXACT_METRIC
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.runtime import Runtime

transformers = pytest.importorskip("transformers")
INT64_MIN = torch.iinfo(torch.int64).min


class _TupleOut(torch.nn.Module):
    """Calls a decoder without its cache and with tuple outputs (no bool kwargs in the exported signature)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.model(input_ids, use_cache=False, return_dict=False)


def _ids(seq: int = 8) -> tuple[torch.Tensor]:
    return (torch.randint(0, 100, (1, seq), generator=torch.Generator().manual_seed(1)),)


def _bert() -> torch.nn.Module:
    return transformers.BertModel(transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                          num_attention_heads=4, intermediate_size=64))


def _distilbert() -> torch.nn.Module:
    return transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4,
                                                                      hidden_dim=64))


def _gpt2() -> torch.nn.Module:
    return _TupleOut(transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)))


def _llama() -> torch.nn.Module:
    return _TupleOut(transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64)))


def _qwen2() -> torch.nn.Module:
    return _TupleOut(transformers.Qwen2Model(transformers.Qwen2Config(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64)))


def _t5() -> torch.nn.Module:
    return transformers.T5EncoderModel(transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64,
                                                             num_layers=2, num_heads=4))


def _vit() -> torch.nn.Module:
    return transformers.ViTModel(transformers.ViTConfig(image_size=16, patch_size=8, num_channels=3, hidden_size=32,
                                                        num_hidden_layers=2, num_attention_heads=4,
                                                        intermediate_size=64))


MODELS = {"bert": _bert, "distilbert": _distilbert, "gpt2": _gpt2, "llama": _llama, "qwen2": _qwen2, "t5": _t5,
          "vit": _vit}


def _inputs(name: str) -> tuple[torch.Tensor]:
    if name == "vit":
        return (torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
    return _ids(32 if name == "t5" else 8)  # T5: relative positions -31..31, as in the issue


@dataclass
class Run:
    model: torch.nn.Module
    inputs: tuple
    aten: torch.export.ExportedProgram
    rec_path: str
    outputs: list[torch.Tensor]
    dump: str
    dbg: str

    def inspector(self) -> Inspector:
        """A fresh Inspector of the recorded run (a test may edit the tables it gets: no other test sees them)."""
        return Inspector(etdump_path=self.dump, etrecord=self.rec_path, debug_buffer_path=self.dbg)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs(name, ort)``: each (model, backend) exported, run and recorded once, in a folder of its own, for every
    test of this module that needs it (they only read its files and objects)."""
    cache: dict[tuple[str, bool], Run] = {}

    def get(name: str, ort: bool) -> Run:
        if (name, ort) not in cache:
            cache[name, ort] = _run(name, str(tmp_path_factory.mktemp(f"{name}_{'ort' if ort else 'portable'}")), ort)
        return cache[name, ort]

    yield get
    cache.clear()


def _run(name: str, out: str, ort: bool) -> Run:
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    inputs = _inputs(name)
    aten = torch.export.export(model, inputs)
    kw = {}
    if ort:
        from edgetorch.backends.onnxruntime import OrtPartitioner

        kw["partitioner"] = [OrtPartitioner()]
    et = to_edge_transform_and_lower(aten, generate_etrecord=True, **kw).to_executorch()
    pte, rec_path = os.path.join(out, "m.pte"), os.path.join(out, "etrecord.bin")
    et.save(pte)
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(rec_path)
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    got = pytree.tree_leaves(program.load_method("forward").execute(*inputs))
    dump, dbg = os.path.join(out, "d.etdp"), os.path.join(out, "dbg.bin")
    program.write_etdump_result_to_file(dump, dbg)
    return Run(model, inputs, aten, rec_path, got, dump, dbg)


def _eager_values(aten: torch.export.ExportedProgram, inputs: tuple) -> dict[str, object]:
    """Every node's value, computed by running torch.export's own unlifted module (not the ETRecord)."""
    gm = aten.module()
    values: dict[str, object] = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n):
            v = super().run_node(n)
            values[n.name] = v.clone() if isinstance(v, torch.Tensor) else v
            return v

    with torch.no_grad():
        Rec(gm).run(*inputs)
    return values


def _first(v: object) -> torch.Tensor | None:
    leaves = [x for x in pytree.tree_leaves(v) if isinstance(x, torch.Tensor)]
    return leaves[0] if leaves else None


def _check_rows(df, eager: dict[str, object], ort: bool) -> None:
    """Every row: same dtype on both sides; the gap recomputed with numpy; the reference side equal to the value
    torch.export's module computes for the row's last op (when that node keeps its name there)."""
    assert df.attrs["exact_metric"] == EXACT_METRIC and df.attrs["distance"] == "MSE"
    for _, row in df.iterrows():
        ref, rt = row["aot_intermediate_output"], row["runtime_intermediate_output"]
        assert ref.dtype == rt.dtype and ref.numel() == rt.numel(), row["aot_ops"]
        assert row["dtype"] == str(ref.dtype).removeprefix("torch.")
        a = ref.detach().reshape(-1).numpy()
        b = rt.detach().reshape(-1).numpy()
        if ref.dtype.is_floating_point:
            assert row["metric"] == "MSE" and row["mismatches"] is None
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            d = np.where(a64 == b64, 0.0, a64 - b64)
            assert np.isclose(row["gap"][0], np.mean(d ** 2), rtol=1e-6, atol=1e-30), row["aot_ops"]
        else:
            n = int(np.count_nonzero(a != b))
            assert row["metric"] == EXACT_METRIC and row["mismatches"] == n, row["aot_ops"]
            assert row["gap"][0] == (n / a.size if a.size else 0.0)
        want = _first(eager.get(row["aot_ops"][-1]))
        if want is not None and want.numel() == ref.numel() and want.dtype == ref.dtype:
            assert torch.equal(want.reshape(ref.shape), ref), row["aot_ops"]
        if not ort:  # the portable backend runs ATen's own kernels (out= variants may round in the last bit)
            assert row["gap"][0] <= (0.0 if row["metric"] == EXACT_METRIC else 1e-10), row["aot_ops"]


@pytest.mark.parametrize("ort", [False, True], ids=["portable", "ort"])
@pytest.mark.parametrize("name", list(MODELS))
def test_hf_model_end_to_end(name, ort, runs):
    run = runs(name, ort)
    # the ETRecord holds a reference graph for the ATen program (no fallback to the full program)
    rec = parse_etrecord(run.rec_path)
    assert rec._lazy is not None and "forward" in rec._lazy.references
    insp = run.inspector()
    df = insp.calculate_numeric_gap("MSE")
    cov = insp.last_gap_coverage
    assert len(df) > 20 and cov.runtime_matched >= 0.9 * cov.runtime_total, cov.unmatched
    assert df.attrs["reference_graph"] == "exported_program"
    _check_rows(df, _eager_values(run.aten, run.inputs), ort)
    # the final output row against eager PyTorch, and the runtime's own output against it
    with torch.no_grad():
        eager_out = [t for t in pytree.tree_leaves(run.model(*run.inputs)) if isinstance(t, torch.Tensor)]
    last = eager_out[0]
    rows = [r for _, r in df.iterrows() if r["aot_intermediate_output"].shape == last.shape
            and torch.equal(r["aot_intermediate_output"], last)]
    assert rows, "no row holds the model output"
    got = run.outputs[0]
    assert got.shape == last.shape
    assert torch.allclose(got, last, atol=1e-4, rtol=1e-4)


def test_t5_relative_bucket_delegate_output_is_paired_with_its_own_op(runs):
    """The issue's T5 row: an ORT delegate whose int64 outputs all have shape (32, 32) (relative positions
    -31..31, and the log-bucket term that holds int64 min where log(0) = -inf). The DELEGATE_CALL row must compare
    the output of the op it names, not the first int64 output of that shape."""
    run = runs("t5", ort=True)
    rec = parse_etrecord(run.rec_path)
    calls = rec.delegate_outputs["forward"]
    groups = {g.instruction_id: g for g in rec.handle_groups["forward"] if g.kind == "delegate_call"}
    assert calls and all(len(v) == len(groups[i].outputs) and v for i, v in calls.items())
    df = run.inspector().calculate_numeric_gap("MSE")
    eager = _eager_values(run.aten, run.inputs)
    delegate_rows = [r for _, r in df.iterrows() if r["runtime_ops"] == ["DELEGATE_CALL"]]
    int_rows = [r for r in delegate_rows if r["dtype"] == "int64" and r["shape"] == (32, 32)]
    assert int_rows
    for r in int_rows:
        assert r["metric"] == EXACT_METRIC
        want = _first(eager[r["aot_ops"][-1]]).reshape(32, 32)
        rt = r["runtime_intermediate_output"].reshape(32, 32)
        sane = want > INT64_MIN // 2  # casting -inf to int64 is up to the backend; everything else is exact
        assert sane.any() and torch.equal(rt[sane], want[sane]), r["aot_ops"]
        assert torch.equal(r["aot_intermediate_output"].reshape(32, 32), want)
    # no row of the table pairs int64 min with small relative positions (the reported MSE 2.66e+36)
    for _, r in df.iterrows():
        if r["dtype"] == "int64":
            assert r["gap"][0] <= 1.0


def test_exact_rows_report_mismatches_and_rank_first(runs):
    """A planted integer fault: the runtime's int64 output of one op differs in 3 elements."""
    from edgetorch.devtools.inspector.comparators import MSEComparator
    from edgetorch.devtools.inspector.numeric_gap import compare_values

    a = torch.arange(10)
    b = a.clone()
    b[[1, 4, 7]] = -(2 ** 62)
    gap, metric, n = compare_values(MSEComparator(), a, b)
    assert (gap, metric, n) == (0.3, EXACT_METRIC, 3)
    assert compare_values(MSEComparator(), a >= 0, b >= 0) == (0.3, EXACT_METRIC, 3)
    with pytest.raises(ValueError, match="cannot compare"):
        compare_values(MSEComparator(), a, a.float())
    # equal infinities are no difference; a NaN is
    x = torch.tensor([float("-inf"), 1.0, 2.0])
    y = torch.tensor([float("-inf"), 1.0, 2.5])
    assert compare_values(MSEComparator(), x, y)[0] == pytest.approx(0.25 / 3)
    insp = runs("bert", ort=False).inspector()
    df = insp.calculate_numeric_gap("SNR")
    i = next(k for k, m in zip(df.index, df["metric"], strict=True) if m == EXACT_METRIC)
    df.at[i, "gap"] = [0.5]
    df.at[i, "local_gap"] = [0.5]
    df.at[i, "mismatches"] = 4  # what calculate_numeric_gap writes for a row with mismatching elements
    df.at[i, "verdict"] = "real"
    assert insp.first_divergence(df, threshold=-1e9)["aot_ops"] == df.at[i, "aot_ops"]
    assert insp.find_culprits(df, top=1).index[0] == i


def test_etrecord_loads_and_inspects_without_transformers(runs):
    """A record of a model returning a ModelOutput parses, and the Inspector computes gaps, in a process that never
    imports transformers; the output spec keeps the type's name."""
    run = runs("bert", ort=False)
    dump, dbg = run.dump, run.dbg
    code = textwrap.dedent(f"""
        import json, sys
        import torch.utils._pytree as pytree
        from edgetorch.devtools import Inspector
        from edgetorch.devtools.etrecord import ForeignContainer, parse_etrecord
        rec = parse_etrecord({run.rec_path!r})
        ep = rec.exported_programs["forward"]
        spec = ep.call_spec.out_spec
        out = ep.module()(*rec.representative_inputs["forward"][0])
        df = Inspector(etdump_path={dump!r}, etrecord={run.rec_path!r},
                       debug_buffer_path={dbg!r}).calculate_numeric_gap("MSE")
        assert "transformers" not in sys.modules, "transformers was imported"
        print(json.dumps({{"type": type(out).__name__, "name": out.type_name, "n": len(pytree.tree_leaves(out)),
                          "rows": len(df), "max_gap": max(g[0] for g in df["gap"])}}))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["type"] == "ForeignContainer"
    assert got["name"] == "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"
    assert got["n"] == 2 and got["rows"] > 20 and got["max_gap"] == 0.0


def test_model_output_reference_outputs_round_trip(tmp_path):
    torch.manual_seed(0)
    model = _bert().eval()
    inputs = _ids()
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    with torch.no_grad():
        out = model(*inputs)
    rec.update_representative_inputs(inputs)
    rec.update_reference_outputs([out])
    path = os.path.join(tmp_path, "r.bin")
    rec.save(path)
    back = parse_etrecord(path).reference_outputs["forward"][0]
    assert isinstance(back, ForeignContainer)
    assert back.type_name == "transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions"
    assert json.loads(back.context) == ["last_hidden_state", "pooler_output"]
    for a, b in zip(pytree.tree_leaves(back), pytree.tree_leaves(out), strict=True):
        assert torch.equal(a, b)


def test_python_operator_targets_round_trip():
    """Dunder ATen ops, operator.* and symbolic-shape callables are storable and resolve back to themselves;
    unknown targets are refused naming the node."""
    import math
    import operator

    from edgetorch.devtools.etrecord._reference import GraphDataError, resolve_target, target_name

    for t in (torch.ops.aten.__and__.Tensor, torch.ops.aten.__or__.Tensor, torch.ops.aten.__xor__.Tensor,
              torch.ops.aten.__lshift__.Scalar, torch.ops.aten.sym_size.int, operator.getitem, operator.and_,
              operator.floordiv, operator.pow, torch.sym_max, torch.sym_not, math.ceil):
        assert resolve_target(target_name(t)) is t
    for bad in ("aten::__class__.default", "aten::__init__.default", "operator::attrgetter", "torch::load",
                "builtins::eval.default", "aten::__and__.__class__"):
        with pytest.raises(GraphDataError):
            resolve_target(bad)


def test_unknown_target_in_reference_graph_names_node(runs):
    import io
    import zipfile

    from tests.fuzz.fuzzlib import reseal_etrecord

    run = runs("gpt2", ort=False)
    with open(run.rec_path, "rb") as f:
        data = f.read()
    zin = zipfile.ZipFile(io.BytesIO(data))
    doc = json.loads(zin.read("reference/0.json"))
    node = next(n for n in doc["nodes"] if n["op"] == "call_function" and "__and__" in n["target"])
    node["target"] = "aten::__globals__.default"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zout:
        for info in zin.infolist():
            payload = json.dumps(doc).encode() if info.filename == "reference/0.json" else zin.read(info)
            zout.writestr(info, payload)
    rec = parse_etrecord(reseal_etrecord(buf.getvalue()))  # edited on purpose: checksums updated
    with pytest.raises(ETRecordFormatError, match=f"node '{node['name']}'.*__globals__") as ei:
        rec.reference_graph()
    assert ei.value.field == "reference/0.json"
