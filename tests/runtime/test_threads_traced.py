"""Two methods of one traced program, each run from its own thread (issue 23): the tracer is the program's, so
runs are serialised per program; every output is the one its own input gives and the ETDump holds every run,
each block with its own method's events and debug values."""

from __future__ import annotations

import threading

import torch

from edgetorch.devtools.etdump import DebugBuffer, read_etdump
from edgetorch.formats import etdump as ed
from edgetorch.models import get_spec, method_module
from edgetorch.runtime import Runtime

RUNS = 40


def _program_bytes() -> tuple[bytes, torch.nn.Module]:
    from edgetorch.exir import to_edge

    spec = get_spec("two_method")
    model = spec.build()
    eps = {m: torch.export.export(method_module(model, m), inp) for m, inp in spec.example_inputs().items()}
    return to_edge(eps).to_executorch().buffer, model


def test_two_methods_of_one_traced_program_on_two_threads(tmp_path):
    data, model = _program_bytes()
    program = Runtime.get().load_program(data, enable_etdump=True, debug_buffer_size="auto")
    methods = {name: program.load_method(name) for name in ("forward", "encode")}
    g = torch.Generator().manual_seed(7)
    inputs = {name: [torch.randn(1, 32, generator=g) for _ in range(RUNS)] for name in methods}
    got: dict[str, list] = {name: [None] * RUNS for name in methods}
    errors: list[BaseException] = []
    start = threading.Barrier(len(methods))

    def work(name: str) -> None:
        try:
            start.wait()
            for i, x in enumerate(inputs[name]):
                got[name][i] = methods[name].execute(x)[0]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with torch.no_grad():
        for name in methods:
            for x, out in zip(inputs[name], got[name]):
                torch.testing.assert_close(out, getattr(model, name)(x), rtol=1e-6, atol=1e-6)
    program.write_etdump_result_to_file(tmp_path / "t.etdp", tmp_path / "t.bin")
    dump = read_etdump(tmp_path / "t.etdp")
    blocks = [r for r in dump.run_data if r.name == ed.EXECUTE_BLOCK]
    assert sorted(b.method for b in blocks) == sorted(["forward"] * RUNS + ["encode"] * RUNS)
    # each block's last debug event is its method's output, bit for bit what that call returned
    seen = {name: 0 for name in methods}
    with DebugBuffer(tmp_path / "t.bin") as buf:
        buf.check(dump)
        for b in blocks:
            outs = [e.debug_event for e in b.events if e.debug_event is not None and e.debug_event.debug_entry.output]
            assert len(outs) == 1
            i = seen[b.method]
            seen[b.method] += 1
            torch.testing.assert_close(buf.value(outs[0].debug_entry), got[b.method][i], rtol=0, atol=0)
