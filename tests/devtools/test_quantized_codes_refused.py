"""Scalar-type codes of quantized dtypes (qint8, quint8, qint32, quint4x2) in an artifact never reach
``torch.frombuffer`` (which crashes the process on them): the ETDump / debug buffer reader and the program
verifier refuse them with a typed error naming the field. Each case runs in a subprocess so a crash is caught."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("code", [12, 13, 14, 16])
def test_quantized_scalar_type_in_an_etdump_is_refused(tmp_path, code):
    script = textwrap.dedent(f"""
        import dataclasses, torch
        from edgetorch.devtools import Inspector
        from edgetorch.devtools.etdump import read_etdump
        from edgetorch.errors import EdgeTorchError
        from edgetorch.exir import to_edge
        from edgetorch.formats.etdump import serialize_etdump
        from edgetorch.runtime import Runtime
        m = torch.nn.Linear(8, 8)
        x = torch.randn(1, 8)
        prog = Runtime.get().load_program(to_edge(torch.export.export(m, (x,))).to_executorch().buffer,
                                          enable_etdump=True, debug_buffer_size="auto")
        prog.load_method("forward").execute(x)
        prog.write_etdump_result_to_file(r"{tmp_path}/a.etdp", r"{tmp_path}/a.bin")
        d = read_etdump(r"{tmp_path}/a.etdp")
        for run in d.run_data:
            for e in run.events:
                if e.debug_event is not None and e.debug_event.debug_entry.tensor is not None:
                    e.debug_event.debug_entry.tensor.scalar_type = {code}
        open(r"{tmp_path}/b.etdp", "wb").write(serialize_etdump(d))
        try:
            Inspector(etdump_path=r"{tmp_path}/b.etdp", debug_buffer_path=r"{tmp_path}/a.bin")
            print("ACCEPTED")
        except EdgeTorchError as err:
            print("REFUSED", type(err).__name__, err)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]  # no crash
    assert "REFUSED" in r.stdout, r.stdout[-2000:]  # a typed error (which check fires depends on the itemsize)


def test_quantized_scalar_type_in_a_program_is_refused():
    import torch

    from edgetorch.errors import ProgramFormatError
    from edgetorch.exir import to_edge
    from edgetorch.formats import program as pf

    et = to_edge(torch.export.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),))).to_executorch()
    prog = et.program
    t = next(v for v in prog.plans[0].values if isinstance(v, pf.TensorDef))
    t.scalar_type = 13
    with pytest.raises(ProgramFormatError, match="unsupported scalar type 13"):
        pf.check_consistency(prog, 1 << 30)
