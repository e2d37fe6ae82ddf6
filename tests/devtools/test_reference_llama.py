"""A KV-cache llama exported, lowered (portable and XNNPACK) and run by the reference (issue 26): the key/value
caches are buffers the program writes in place at ``input_pos``, one token per call. Every reference row of the
gap table is in edgetorch's with the same gap (against the edge program, the reference the ATen program's
split ``unbind`` makes both choose for every row); a clean program names no culprit; one ETDump of four
calls (one per token) gives per-call views whose call ``k`` is debugged from the caches the calls before it
wrote, each ending at the logits the runtime returned and eager PyTorch computes."""

from __future__ import annotations

import json
import math

import pytest
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.etrecord import parse_etrecord
from tests.devtools._reference_data import DATA, debug_buffer, unpack

BACKENDS = ("portable", "xnnpack")


def _inspector(name: str, etrecord=None) -> Inspector:
    return Inspector(etdump_path=str(DATA / f"{name}.etdp"), etrecord=etrecord or str(DATA / f"{name}_etrecord.bin"),
                     debug_buffer_path=str(debug_buffer(name)))


def _table(df) -> dict[tuple[int, ...], float]:
    return {tuple(sorted(set(h))): g[0] for h, g in zip(df["aot_debug_handle"], df["gap"], strict=True)}


@pytest.mark.parametrize("metric", ["MSE", "L1"])
def test_portable_llama_rows_equal_the_reference_inspectors(metric: str) -> None:
    ins = _inspector("llama_portable")
    ref = json.loads((DATA / "llama_portable_gaps.json").read_text())
    df = ins.calculate_numeric_gap(metric)
    assert df.attrs["reference_graph"] == "edge_dialect_exported_program"  # the ATen program's unbind is split
    ours = _table(df)
    default = {tuple(sorted(set(r["aot_debug_handle"]))) for r in ref["gaps"][metric]}
    assert default and default <= set(ours)  # every row of the reference's own (ATen) table is present
    rows = ref["gaps_edge"][metric]
    assert len(rows) >= 80
    nan_rows = 0
    for row in rows:
        key = tuple(sorted(set(row["aot_debug_handle"])))
        want = row["gap"][0]
        if want == "nan":  # the reference's inf - inf at the attention mask's -inf; edgetorch counts them equal
            nan_rows += 1
            assert math.isfinite(ours[key]) and ours[key] < 1e-6, key
            continue
        assert ours[key] == pytest.approx(want, rel=1e-6, abs=0), (metric, key, row["aot_ops"])
    assert nan_rows == 3  # the mask row and the two masked attention scores
    if metric == "MSE":
        assert len(ins.find_culprits(df)) == 0


def test_xnnpack_llama_has_a_table_where_the_reference_raises() -> None:
    ref = json.loads((DATA / "llama_xnnpack_gaps.json").read_text())
    assert ref["reference_failure"].startswith("ValueError") and not ref["gaps"]
    ins = _inspector("llama_xnnpack")
    df = ins.calculate_numeric_gap("MSE")
    assert len(df) >= 20 and len(ins.find_culprits(df)) == 0
    delegated = [ops for ops in df["runtime_ops"] if "DELEGATE_CALL" in ops]
    assert delegated and all(math.isfinite(g[0]) for g in df["gap"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_token_calls(backend: str) -> None:
    name = f"llama_{backend}"
    info = json.loads((DATA / f"{name}_tokens.json").read_text())
    n = len(info["tokens"])
    inputs = [(torch.tensor([[t]]), torch.tensor([k])) for k, t in enumerate(info["tokens"])]
    rec = parse_etrecord(str(DATA / f"{name}_etrecord.bin"))
    rec.update_representative_inputs(inputs)
    ins = Inspector(etdump_path=str(DATA / f"{name}_tokens.etdp"), etrecord=rec,
                    debug_buffer_path=str(unpack(DATA / f"{name}_tokens_debug.bin.gz")))
    (block,) = [b for b in ins.event_blocks if b.name == "Execute"]
    assert block.num_runs == n
    frame = ins.to_dataframe()
    assert len(frame) and frame["event_name"].str.startswith(("native_call_", "DELEGATE_CALL")).any()
    single = _table(_inspector(name).calculate_numeric_gap("MSE"))
    vocab = len(info["runtime_logits"][0][0][0])
    for k in range(n):
        runtime_logits = torch.tensor(info["runtime_logits"][k])
        df = ins.calculate_numeric_gap("MSE", run=k)
        assert len(ins.find_culprits(df)) == 0, (backend, k)
        # the reference's value of the last op (the LM head) is the eager model's logits for this token: call k
        # was replayed from the caches calls 0..k-1 wrote
        heads = [(max(h), v, r) for h, v, r in zip(df["aot_debug_handle"], df["aot_intermediate_output"],
                                                    df["runtime_intermediate_output"], strict=True)
                 if isinstance(v, torch.Tensor) and v.shape[-1] == vocab]
        _, aot, rt = max(heads, key=lambda x: x[0])
        torch.testing.assert_close(aot.reshape(-1), torch.tensor(info["eager_logits"][k]).reshape(-1),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(rt.reshape(-1), runtime_logits.reshape(-1))
        if k == 0:
            assert _table(df) == pytest.approx(single, rel=1e-6, abs=0)
