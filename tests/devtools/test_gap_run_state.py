"""``calculate_numeric_gap(run=k)`` on a program with mutable state (issue 23): call k is compared with a reference
replayed through calls 0..k-1 (the state the runtime had), as ``execution=`` does, never with a reference run
from the initial state."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from edgetorch.devtools import Inspector
from edgetorch.exir import to_edge
from edgetorch.runtime import Runtime


class Accumulate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.register_buffer("acc", torch.zeros(1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.acc.add_(x)
        return self.lin(self.acc)


def test_run_k_of_a_stateful_program_replays_the_earlier_runs(tmp_path):
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(1, 4, generator=g) for _ in range(3)]
    et = to_edge(torch.export.export(Accumulate(), (xs[0],)), generate_etrecord=True).to_executorch()
    rec = et.get_etrecord()
    rec.update_representative_inputs([(x,) for x in xs])
    rec.save(tmp_path / "rec.bin")
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    m = prog.load_method("forward")
    outs = [m.execute(x)[0] for x in xs]
    prog.write_etdump_result_to_file(tmp_path / "r.etdp", tmp_path / "r.bin")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        insp = Inspector(etdump_path=tmp_path / "r.etdp", etrecord=tmp_path / "rec.bin",
                         debug_buffer_path=tmp_path / "r.bin")
        by_run = insp.calculate_numeric_gap("MSE", run=2)
        by_execution = insp.calculate_numeric_gap("MSE", execution=2)
    cols = [c for c in by_run.columns if "time" not in str(c).lower()]
    assert by_run[cols].astype(str).equals(by_execution[cols].astype(str))
    final = by_run.iloc[-1]
    want = Accumulate().lin(xs[0] + xs[1] + xs[2]).detach()  # the state after three calls, eager
    torch.testing.assert_close(outs[2], want, rtol=1e-6, atol=1e-6)
    gap = final["gap"]
    gap = max(gap) if isinstance(gap, (list, tuple)) else float(gap)
    assert gap < 1e-10  # was far from 0 when run 2 was compared with a run from the initial state
