"""Allocations filled later are compared as the op made them: a ``new_zeros`` mask written through slices (Swin's
shifted-window mask) is compared as zeros, not as the mask it becomes; an ``empty_like`` later filled by
``copy_`` / slice writes (MoE experts) is not compared at all (its bytes are no result), and the ops after it
start from the runtime's bytes. A clean portable program then names no culprit."""

from __future__ import annotations

import torch

from edgetorch.devtools import Inspector
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.runtime import Runtime


class ShiftedWindowMask(torch.nn.Module):
    """Swin's attention-mask construction: zeros, then one id per window region written through slices."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x.new_zeros((1, 8, 8))
        region = 0
        for h in (slice(0, 4), slice(4, 6), slice(6, None)):
            for w in (slice(0, 4), slice(4, 6), slice(6, None)):
                mask[:, h, w] = region
                region += 1
        return self.proj(x) + mask


class EmptyThenFilled(torch.nn.Module):
    """MoE-style: ``empty_like`` buffers filled by ``copy_`` and by slice writes."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        out.copy_(self.a(x))
        y = torch.empty_like(x)
        y[:, :4] = self.b(x)[:, :4]
        y[:, 4:] = x[:, 4:]
        return out * y


def _inspect(model: torch.nn.Module, x: torch.Tensor, tmp_path) -> tuple[Inspector, torch.Tensor]:
    et = to_edge_transform_and_lower(torch.export.export(model, (x,)), generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs((x,))
    rec.save(tmp_path / "r.bin")
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    (out,) = prog.load_method("forward").execute(x)
    prog.write_etdump_result_to_file(tmp_path / "e.etdp", tmp_path / "e.bin")
    insp = Inspector(etdump_path=tmp_path / "e.etdp", etrecord=tmp_path / "r.bin", debug_buffer_path=tmp_path / "e.bin")
    return insp, out


def test_a_mask_written_through_slices_is_compared_as_zeros(tmp_path):
    torch.manual_seed(0)
    model, x = ShiftedWindowMask().eval(), torch.randn(1, 8, 8)
    insp, out = _inspect(model, x, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    df = insp.calculate_numeric_gap("MSE")
    row = df[[ops == ["new_zeros"] for ops in df["aot_ops"]]].iloc[0]
    assert torch.equal(row["aot_intermediate_output"], torch.zeros(1, 8, 8))  # the value new_zeros made
    assert torch.equal(row["runtime_intermediate_output"].reshape(1, 8, 8), torch.zeros(1, 8, 8))
    assert row["verdict"] == "exact"
    assert insp.find_culprits(df).empty
    assert all(v == "exact" for v in df["verdict"])  # the portable kernels are ATen's


def test_empty_like_filled_later_is_no_culprit(tmp_path):
    torch.manual_seed(0)
    model, x = EmptyThenFilled().eval(), torch.randn(1, 8, 8)
    insp, out = _inspect(model, x, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    df = insp.calculate_numeric_gap("MSE")
    assert not any("empty" in op for ops in df["aot_ops"] for op in ops)
    reasons = [u["reason"] for u in df.attrs["coverage"].unmatched if u["side"] == "runtime"]
    assert sum("uninitialised allocation" in r for r in reasons) == 2
    culprits = insp.find_culprits(df)
    assert culprits.empty, [list(o) for o in culprits["aot_ops"]]
    assert all(v == "exact" for v in df["verdict"]), df[["aot_ops", "verdict"]]
