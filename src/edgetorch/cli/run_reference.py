"""``edgetorch run`` on a program or bundled program written by the reference ExecuTorch (.pte "ET12", .bpte
"BP08"): it runs in the reference's own runtime (the optional ``executorch`` package, imported here only), with
the same flags, and writes the reference's ETDump and debug buffer, which ``edgetorch inspect`` reads.

The reference's Python runtime logs every intermediate output as soon as it has a debug buffer (it has no
"outputs only" level), so ``--dump_outputs`` records intermediates too; ``--debug_buffer_size auto`` is 64 MiB
(the reference aborts the process when the buffer overflows).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from edgetorch.cli._common import CliError

__all__ = ["AUTO_DEBUG_BUFFER", "reference_kind", "run_reference"]

AUTO_DEBUG_BUFFER = 64 << 20
_IDENTIFIERS = {b"ET12": "program", b"BP08": "bundled program"}


def reference_kind(path: str) -> str | None:
    """"program" / "bundled program" for a file the reference wrote, else None (edgetorch's or unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return _IDENTIFIERS.get(head[4:8]) if len(head) == 8 else None


def _runtime(path: str, kind: str) -> Any:
    try:
        from executorch.runtime import Runtime
    except ImportError:
        raise CliError(f"{path} is an ExecuTorch {kind}: running it needs the reference runtime, which is not "
                       "installed (pip install -e '.[reference]' && pip install --no-deps executorch==1.5.1); "
                       "edgetorch inspect reads the ETDump and ETRecord it writes either way") from None
    return Runtime.get()


def _case(path: str, args: argparse.Namespace) -> tuple[bytes, str | None, list | None, list | None]:
    """The embedded program, method, inputs and expected outputs of test case ``--testset_idx``."""
    from edgetorch.devtools.bundled_program.executorch import read_executorch_bundled_program
    from edgetorch.errors import FormatError

    try:
        with open(path, "rb") as f:
            bp = read_executorch_bundled_program(f.read(), path)
    except FormatError as e:
        raise CliError(str(e)) from None
    suites = {s.method_name: s for s in bp.method_test_suites}
    method = args.method or (next(iter(suites)) if suites else None)
    if method not in suites:
        raise CliError(f"{path} has no test cases for method {method!r} (bundled: {', '.join(suites)})")
    cases = suites[method].test_cases
    if not 0 <= args.testset_idx < len(cases):
        raise CliError(f"--testset_idx {args.testset_idx} is out of range: method '{method}' has {len(cases)} "
                       "test case(s)")
    case = cases[args.testset_idx]
    return bp.program, method, list(case.inputs), case.expected_outputs


def _ones(method: Any) -> list:
    import torch

    from edgetorch.formats.dtypes import code_dtype

    meta = method.metadata
    infos = [meta.input_tensor_meta(i) for i in range(meta.num_inputs())]
    return [torch.ones(tuple(t.sizes()), dtype=code_dtype(int(t.dtype()))) for t in infos]


def run_reference(args: argparse.Namespace, path: str, kind: str, etdump_path: str | None, dump_level: str | None,
                  out: Any = sys.stdout) -> tuple[list, list | None]:
    """Loads and runs ``path`` in the reference runtime; writes the ETDump / debug buffer; returns the last run's
    flat outputs and the expected outputs (bundled program only)."""
    runtime = _runtime(path, kind)
    data, method_name, inputs, expected = (_case(path, args) if kind == "bundled program"
                                           else (path, args.method, None, None))
    size = args.debug_buffer_size if dump_level else 0
    size = AUTO_DEBUG_BUFFER if size == "auto" else int(size)
    try:
        program = runtime.load_program(data, enable_etdump=etdump_path is not None, debug_buffer_size=size)
        names = sorted(program.method_names)
        method_name = method_name or (names[0] if len(names) == 1 else None)
        if method_name not in names:
            raise CliError(f"{path}: choose a method with --method (methods: {', '.join(names)})")
        method = program.load_method(method_name)
    except RuntimeError as e:
        raise CliError(f"the reference runtime cannot load {path}: {e}") from None
    print(f"Model file {path} (ExecuTorch {kind}) is loaded in the reference runtime.", file=out)
    if inputs is None:
        inputs = _ones(method)
        print(f"Inputs: {len(inputs)} filled with ones", file=out)
    times, result = [], []
    for _ in range(args.num_executions):
        t = time.perf_counter()
        try:
            result = list(method.execute(inputs))
        except RuntimeError as e:
            raise CliError(f"method '{method_name}' failed in the reference runtime: {e}") from None
        times.append(time.perf_counter() - t)
    print(f"Model executed successfully ({1000 * sum(times) / len(times):.2f} ms per execution).", file=out)
    if etdump_path is not None:
        program.write_etdump_result_to_file(etdump_path, args.debug_output_path if size else None)
        print(f"ETDump written to {etdump_path}" + (f"; debug buffer ({size} bytes) written to "
                                                     f"{args.debug_output_path}." if size else "."), file=out)
    return result, expected
