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


CODES = (12, 13, 14, 16)


@pytest.fixture(scope="module")
def etdump_verdicts(tmp_path_factory) -> dict[int, str]:
    """One subprocess (a crash in it is caught) records one ETDump, then reads it back with each code in turn as
    every debug tensor's scalar type: ``{code: "REFUSED <error>" | "ACCEPTED" | "CRASHED ..." | "NOT REACHED ..."}``
    (it announces each code before reading, so a crash names the code that caused it)."""
    tmp = tmp_path_factory.mktemp("codes")
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
        prog.write_etdump_result_to_file(r"{tmp}/a.etdp", r"{tmp}/a.bin")
        for code in {CODES!r}:
            print("CODE", code, flush=True)
            d = read_etdump(r"{tmp}/a.etdp")
            for run in d.run_data:
                for e in run.events:
                    if e.debug_event is not None and e.debug_event.debug_entry.tensor is not None:
                        e.debug_event.debug_entry.tensor.scalar_type = code
            open(r"{tmp}/b.etdp", "wb").write(serialize_etdump(d))
            try:
                Inspector(etdump_path=r"{tmp}/b.etdp", debug_buffer_path=r"{tmp}/a.bin")
                print("ACCEPTED", flush=True)
            except EdgeTorchError as err:
                print("REFUSED", type(err).__name__, err, flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    verdicts: dict[int, str] = {}
    code = None
    for line in r.stdout.splitlines():
        if line.startswith("CODE "):
            code = int(line.split()[1])
        elif code is not None and code not in verdicts:
            verdicts[code] = line
    if r.returncode != 0:  # no crash may happen
        tail = f"(exit {r.returncode}): {r.stderr[-2000:]}"
        if code is not None and code not in verdicts:  # reading this code crashed it: the later ones never ran
            verdicts[code] = f"CRASHED {tail}"
            verdicts.update({c: f"NOT REACHED {tail}" for c in CODES if c not in verdicts})
        else:  # it crashed elsewhere (recording, or at exit): no code is cleared
            verdicts = {c: f"CRASHED {tail}" for c in CODES}
    return verdicts


@pytest.mark.parametrize("code", CODES)
def test_quantized_scalar_type_in_an_etdump_is_refused(etdump_verdicts, code):
    verdict = etdump_verdicts.get(code, "no verdict")
    # no crash, and a typed error (which check fires depends on the itemsize)
    assert verdict.startswith("REFUSED"), verdict


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
