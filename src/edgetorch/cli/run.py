"""``edgetorch run``: the command-line runner (the ExecuTorch example runner's flags).

Loads a bundled program (.bpte) or a plain program (.pte), runs one method on a bundled test case (or on
inputs filled with ones), optionally verifies the outputs against the bundled expected outputs and writes an
ETDump (profile) and a debug buffer (program outputs or every intermediate output).

Exit status: 0 success, 1 output verification failed, 2 bad arguments or input files, 3 the run failed.
Only the runtime (and torch) is imported: not the compiler, torch.export machinery, pandas or rich.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from edgetorch.cli._common import CliError, check_output_path, guarded

__all__ = ["EXIT_OK", "EXIT_VERIFY_FAILED", "EXIT_RUN_FAILED", "DEFAULT_RTOL", "DEFAULT_ATOL", "RunFailed",
           "add_arguments", "OutputCheck", "compare_output", "run"]

EXIT_OK, EXIT_VERIFY_FAILED, EXIT_RUN_FAILED = 0, 1, 3  # 2: bad arguments (edgetorch.cli._common)
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-5  # the reference runner's (hard-coded there) tolerances


class RunFailed(Exception):
    """Loading or executing the program failed (exit status 3)."""


_MAX_DEBUG_BUFFER_BYTES = 1 << 40  # runtime.debug_sink.MAX_DEBUG_BUFFER_BYTES (not imported: --help stays light)


def _buffer_size(text: str) -> int | str:
    t = text.strip().lower()
    if t == "auto":
        return "auto"
    mult = 1
    for suffix, m in (("kib", 1 << 10), ("mib", 1 << 20), ("gib", 1 << 30), ("k", 1 << 10), ("m", 1 << 20),
                      ("g", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-len(suffix)], m
            break
    try:
        n = int(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes (e.g. 1073741824 or 1G) or 'auto', "
                                         f"got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    if n > _MAX_DEBUG_BUFFER_BYTES:
        raise argparse.ArgumentTypeError(f"at most {_MAX_DEBUG_BUFFER_BYTES} bytes (1 TiB; a fixed buffer is "
                                         f"allocated up front, use 'auto' to size it per run), got {text!r}")
    return n


def _check_buffer_size(args: argparse.Namespace, method: Any, dump_level: str | None) -> None:
    """A fixed ``--debug_buffer_size`` that cannot hold the runs asked for is a user error, found before running
    (a static method's runs store exactly ``debug_buffer_bytes`` each; a dynamic one is checked as it runs)."""
    size = args.debug_buffer_size
    if dump_level != "intermediates" or not isinstance(size, int) or method.plan.symbols:
        return
    need = method.metadata.debug_buffer_bytes * args.num_executions
    if size < need:
        raise CliError(f"--debug_buffer_size {size} is too small: {args.num_executions} execution(s) of method "
                       f"'{method.name}' store {need} bytes of intermediate outputs (pass at least {need}, or auto)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("program")
    src.add_argument("--bundled_program_path", default=None,
                     help="bundled program (.bpte) to run on its test case (default model_bundled.bpte when "
                          "--model_path is not given)")
    src.add_argument("--model_path", default=None,
                     help="plain program (.pte) to run on inputs filled with ones")
    src.add_argument("--method", default=None,
                     help="method to run (default forward, or the program's only/first method)")
    src.add_argument("--testset_idx", type=int, default=0, help="bundled test case to run (default 0)")
    src.add_argument("--num_executions", type=int, default=1, help="times to execute the method (default 1)")
    ver = p.add_argument_group("verification")
    ver.add_argument("--output_verification", action="store_true",
                     help="compare the outputs with the bundled expected outputs; exit 1 when they differ")
    ver.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default {DEFAULT_RTOL})")
    ver.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"absolute tolerance (default {DEFAULT_ATOL})")
    ver.add_argument("--print_output", action="store_true", help="print the outputs")
    dbg = p.add_argument_group("ETDump and debug buffer")
    dbg.add_argument("--etdump_path", default=None,
                     help="write an ETDump (per-op profile) here (default etdump.etdp when a dump flag is set)")
    dbg.add_argument("--dump_outputs", action="store_true",
                     help="record the program outputs in the debug buffer")
    dbg.add_argument("--dump_intermediate_outputs", action="store_true",
                     help="record every intermediate output in the debug buffer (takes precedence over "
                          "--dump_outputs)")
    dbg.add_argument("--debug_output_path", default="debug_output.bin",
                     help="where the debug buffer is written (default debug_output.bin)")
    dbg.add_argument("--debug_buffer_size", type=_buffer_size, default="auto",
                     help="debug buffer bytes (suffix K/M/G allowed) or 'auto' (exactly what the runs need; "
                          "default). A fixed size that is too small fails the run with the size needed")


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def _resolve_method(names: list[str], requested: str | None, what: str) -> str:
    if requested is not None:
        if requested not in names:
            raise CliError(f"{what} has no method '{requested}' (methods: {', '.join(sorted(names))})")
        return requested
    if "forward" in names or not names:
        return "forward"
    return sorted(names)[0]


def _fmt_shape(v: Any) -> str:
    import torch

    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).replace('torch.', '')} {list(v.shape)}"
    return type(v).__name__


class OutputCheck:
    """Comparison of one runtime output with its expected value."""

    def __init__(self, index: int, ok: bool, what: str, reason: str = "", n_bad: int = 0, numel: int = 0,
                 max_abs: float = 0.0, mean_abs: float = 0.0, max_rel: float = 0.0, mean_rel: float = 0.0) -> None:
        self.index, self.ok, self.what, self.reason = index, ok, what, reason
        self.n_bad, self.numel = n_bad, numel
        self.max_abs, self.mean_abs, self.max_rel, self.mean_rel = max_abs, mean_abs, max_rel, mean_rel

    def line(self) -> str:
        stats = (f"max abs error {self.max_abs:.6g}, mean abs error {self.mean_abs:.6g}, max relative error "
                 f"{self.max_rel:.6g}, mean relative error {self.mean_rel:.6g}")
        head = f"  output {self.index} ({self.what}): "
        if self.reason:
            return head + self.reason
        if not self.ok:
            return head + f"{self.n_bad} of {self.numel} elements outside tolerance; " + stats
        return head + stats


def compare_output(index: int, actual: Any, expected: Any, rtol: float, atol: float) -> OutputCheck:
    """Checks one output. Tensors: dtype and shape must match; floating point elementwise
    |actual - expected| <= atol + rtol * |actual| (NaN == NaN, same-sign infinities equal); other dtypes
    exactly. Relative errors are taken over the elements whose expected value is not 0."""
    import torch

    what = _fmt_shape(expected)
    if not isinstance(expected, torch.Tensor):
        ok = type(actual) is type(expected) and actual == expected
        return OutputCheck(index, ok, what, "" if ok else f"expected {expected!r}, got {actual!r}")
    if not isinstance(actual, torch.Tensor):
        return OutputCheck(index, False, what, f"expected a tensor, got {type(actual).__name__}")
    if actual.dtype != expected.dtype:
        return OutputCheck(index, False, what, f"dtype differs: expected {expected.dtype}, got {actual.dtype}")
    if actual.shape != expected.shape:
        return OutputCheck(index, False, what,
                           f"shape differs: expected {list(expected.shape)}, got {list(actual.shape)}")
    n = expected.numel()
    if n == 0:
        return OutputCheck(index, True, what, numel=0)
    if expected.is_complex():
        a, e = torch.view_as_real(actual).double(), torch.view_as_real(expected).double()
    else:
        a, e = actual.double(), expected.double()
    diff = (a - e).abs()
    both_nan = a.isnan() & e.isnan()
    same_inf = a.isinf() & e.isinf() & (a == e)
    diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    if expected.is_floating_point() or expected.is_complex():
        if rtol == 0 and atol == 0:
            bad = diff != 0
        else:
            bad = diff > atol + rtol * a.abs().nan_to_num(nan=0.0, posinf=0.0)
            bad &= ~(both_nan | same_inf)
    else:
        bad = actual != expected
    nz = e != 0
    rel = diff[nz] / e[nz].abs()
    n_bad = int(bad.sum())
    return OutputCheck(index, n_bad == 0, what, n_bad=n_bad, numel=n, max_abs=float(diff.max()),
                       mean_abs=float(diff.mean()), max_rel=float(rel.max()) if rel.numel() else 0.0,
                       mean_rel=float(rel.mean()) if rel.numel() else 0.0)


def _ones_inputs(plan: Any) -> list:
    import torch

    from edgetorch.formats import program as pf
    from edgetorch.formats.dtypes import code_dtype

    out = []
    for vid in plan.inputs:
        v = plan.values[vid]
        if isinstance(v, pf.TensorDef):
            out.append(torch.ones(v.sizes, dtype=code_dtype(v.scalar_type)))
        else:
            out.append(v)
    return out


def _call_args(plan: Any, flat: list) -> tuple[tuple, dict]:
    """Restructures flat inputs with the method's input spec into (args, kwargs)."""
    import warnings

    import torch.utils._pytree as pytree

    if not plan.input_spec:
        return tuple(flat), {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        spec = pytree.treespec_loads(plan.input_spec)
    try:
        args, kwargs = pytree.tree_unflatten(flat, spec)
    except Exception:  # a spec that is not (args, kwargs): pass the leaves positionally
        return tuple(flat), {}
    return tuple(args), dict(kwargs)


def _dump_outputs(program: Any, outputs_per_run: list[list], plan: Any, etdump_path: str, debug_path: str,
                  limit: int | str) -> int:
    """Writes an ETDump whose execute blocks also log the program outputs, and the debug buffer holding
    their bytes (the reference runner's ``--dump_outputs`` level). Returns the debug buffer size."""
    import torch

    from edgetorch._fileio import atomic_write
    from edgetorch.errors import DebugBufferOverflowError
    from edgetorch.formats import etdump as ed
    from edgetorch.formats.dtypes import dtype_code

    dump = program.tracer.etdump()
    chunks: list[Any] = []
    pos = 0
    execs = [r for r in dump.run_data if r.name == ed.EXECUTE_BLOCK and r.method == plan.name]
    for run, outs in zip(execs, outputs_per_run):
        events = []
        for j, v in enumerate(outs):
            name = plan.output_names[j] if j < len(plan.output_names) else f"output_{j}"
            if isinstance(v, torch.Tensor):
                t = v.detach().contiguous()
                nbytes = t.numel() * t.element_size()
                sizes = list(t.shape)
                strides = [1] * len(sizes)
                for k in range(len(sizes) - 2, -1, -1):
                    strides[k] = strides[k + 1] * max(sizes[k + 1], 1)
                off = ed.NO_OFFSET
                if nbytes:
                    off = pos
                    chunks.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                    pad = -nbytes % ed.DEBUG_BUFFER_ALIGNMENT
                    if pad:
                        chunks.append(b"\0" * pad)
                    pos += nbytes + pad
                value = ed.Value(ed.ValueType.Tensor, tensor=ed.Tensor(dtype_code(t.dtype), sizes, strides, off,
                                                                       nbytes), output=True)
            elif isinstance(v, bool):
                value = ed.Value(ed.ValueType.Bool, bool_value=v, output=True)
            elif isinstance(v, int):
                value = ed.Value(ed.ValueType.Int, int_value=v, output=True)
            elif isinstance(v, float):
                value = ed.Value(ed.ValueType.Double, double_value=v, output=True)
            else:
                value = ed.Value(ed.ValueType.Null, output=True)
            events.append(ed.Event(debug_event=ed.DebugEvent(-1, -1, -1, "", value, j, name)))
        # before the closing "Method::execute" profile event, as the tracer logs program outputs
        cut = len(run.events)
        if run.events and run.events[-1].profile_event is not None \
                and run.events[-1].profile_event.name == ed.METHOD_EXECUTE:
            cut -= 1
        run.events[cut:cut] = events
    if isinstance(limit, int) and limit and pos > limit:
        raise DebugBufferOverflowError(f"debug buffer of {limit} bytes is too small: the program outputs take "
                                       f"{pos} bytes (pass --debug_buffer_size auto)", needed_bytes=pos,
                                       capacity=limit)
    dump.debug_buffer_bytes = pos
    crc: list[int] = []
    atomic_write(debug_path, ed.sealed_chunks(chunks, dump.program_hash, dump.run_id, crc))
    dump.debug_buffer_crc32 = crc[-1]
    atomic_write(etdump_path, [ed.serialize_etdump(dump)])
    return pos


# ----------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------

@dataclass
class _Request:
    """What the flags ask for, checked: the file, its kind and where the trace goes."""

    bundled: bool
    path: str
    dump_level: str | None  # "outputs", "intermediates" or None
    etdump_path: str | None


def _check_args(args: argparse.Namespace) -> _Request:
    if args.bundled_program_path is not None and args.model_path is not None:
        raise CliError("give either --bundled_program_path or --model_path, not both")
    bundled = args.model_path is None
    path = (args.bundled_program_path or "model_bundled.bpte") if bundled else args.model_path
    flag = "--bundled_program_path" if bundled else "--model_path"
    if args.num_executions < 1:
        raise CliError(f"--num_executions must be >= 1, got {args.num_executions}")
    if args.rtol < 0 or args.atol < 0:
        raise CliError("--rtol and --atol must be >= 0")
    if args.output_verification and not bundled:
        raise CliError("--output_verification needs a bundled program (--bundled_program_path): a plain .pte has "
                       "no expected outputs")
    if not os.path.exists(path):
        raise CliError(f"{'bundled program' if bundled else 'program'} file not found: {path}")
    if os.path.isdir(path):
        raise CliError(f"{flag} {path} is a directory")
    dump_level = "intermediates" if args.dump_intermediate_outputs else "outputs" if args.dump_outputs else None
    etdump_path = args.etdump_path or ("etdump.etdp" if dump_level else None)
    if etdump_path:
        check_output_path(etdump_path, "--etdump_path")
    if dump_level:
        check_output_path(args.debug_output_path, "--debug_output_path")
        if os.path.abspath(args.debug_output_path) == os.path.abspath(etdump_path):
            raise CliError("--etdump_path and --debug_output_path name the same file")
    return _Request(bundled, path, dump_level, etdump_path)


def _map_file(path: str) -> Any:
    import mmap

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}") from None


def _read_test_case(args: argparse.Namespace, path: str) -> tuple[str, list, list | None]:
    """A bundled program's test case: (method name, flat inputs, expected outputs or None)."""
    import mmap

    from edgetorch.errors import FormatError
    from edgetorch.formats import bundled_program as bpf

    buf = _map_file(path)
    if not bpf.is_bundled_program(buf):
        if bytes(buf[:8]) == bpf.PTE_MAGIC:
            raise CliError(f"{path} is a plain program (.pte), not a bundled program: pass it with --model_path")
        raise CliError(f"{path} is not an edgetorch bundled program (.bpte)")
    try:
        bundle = bpf.read_bundle(buf, path)
    except FormatError as e:
        raise CliError(str(e)) from None
    names = [s.method_name for s in bundle.suites]
    if not names:
        raise CliError(f"{path} holds no test cases")
    method_name = args.method if args.method is not None else _resolve_method(names, None, path)
    if method_name not in names:
        raise CliError(f"{path} has no test cases for method '{method_name}' (bundled methods: "
                       f"{', '.join(names)})")
    cases = bundle.suite(method_name).test_cases
    if not 0 <= args.testset_idx < len(cases):
        raise CliError(f"--testset_idx {args.testset_idx} is out of range: method '{method_name}' has "
                       f"{len(cases)} test case(s) (0..{len(cases) - 1})")
    case = cases[args.testset_idx]
    flat_inputs = [bpf.tensor_to_torch(v) if isinstance(v, bpf.TensorData) else v for v in case.inputs]
    expected = None
    if case.expected_outputs is not None:
        expected = [bpf.tensor_to_torch(v) if isinstance(v, bpf.TensorData) else v for v in case.expected_outputs]
    if args.output_verification and expected is None:
        raise CliError(f"--output_verification: test case {args.testset_idx} of method '{method_name}' has no "
                       "expected outputs")
    del bundle, case, cases
    if isinstance(buf, mmap.mmap):
        try:
            buf.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass
    return method_name, flat_inputs, expected


def _load(args: argparse.Namespace, req: _Request, method_name: str | None) -> tuple[Any, Any, float]:
    """Loads the program (fully verified) and its method: (program, method, load seconds)."""
    from edgetorch.errors import DebugBufferConfigError, EdgeTorchError, FormatError
    from edgetorch.runtime import Runtime, Verification

    dbg_size = args.debug_buffer_size if req.dump_level == "intermediates" else 0
    t0 = time.perf_counter()
    try:
        # the command line verifies the whole file, weights included, before running it
        program = Runtime.get().load_program(req.path, enable_etdump=req.etdump_path is not None,
                                             debug_buffer_size=dbg_size, verification=Verification.Full)
    except (FormatError, DebugBufferConfigError) as e:
        raise CliError(str(e)) from None
    except EdgeTorchError as e:
        raise RunFailed(f"cannot load {req.path}: {e}") from None
    print(f"Model file {req.path} is loaded.", file=sys.stdout)
    if not req.bundled:
        method_name = _resolve_method(sorted(program.method_names), args.method, req.path)
    elif method_name not in program.method_names:
        raise CliError(f"{req.path}: the embedded program has no method '{method_name}'")
    try:
        method = program.load_method(method_name)
    except FormatError as e:
        raise CliError(str(e)) from None
    except EdgeTorchError as e:
        raise RunFailed(f"cannot load method '{method_name}': {e}") from None
    return program, method, time.perf_counter() - t0


def _execute(args: argparse.Namespace, method: Any, flat_inputs: list, keep: bool) -> tuple[list, list[list],
                                                                                            list[float]]:
    """Runs the method ``--num_executions`` times: (last flat outputs, each run's outputs if ``keep``, times)."""
    import torch.utils._pytree as pytree

    from edgetorch.errors import DebugBufferOverflowError, EdgeTorchError, RuntimeInputError

    call_args, call_kwargs = _call_args(method.plan, flat_inputs)
    outputs_per_run: list[list] = []
    times = []
    flat_out: list = []
    for _ in range(args.num_executions):
        t2 = time.perf_counter()
        try:
            result = method.execute(*call_args, **call_kwargs)
        except (RuntimeInputError, DebugBufferOverflowError) as e:  # inputs that do not fit, a buffer too small
            raise CliError(str(e)) from None
        except EdgeTorchError as e:
            raise RunFailed(f"method '{method.name}' failed: {e}") from None
        times.append(time.perf_counter() - t2)
        flat_out = pytree.tree_leaves(result)
        outputs_per_run.append(flat_out if keep else [])
    return flat_out, outputs_per_run, times


def _write_trace(args: argparse.Namespace, req: _Request, program: Any, method: Any,
                 outputs_per_run: list[list]) -> None:
    """Writes the ETDump and, with a dump level, the debug buffer (program outputs or every intermediate)."""
    from edgetorch.errors import EdgeTorchError

    out, etdump_path = sys.stdout, req.etdump_path
    try:
        if req.dump_level == "outputs":
            n = _dump_outputs(program, outputs_per_run, method.plan, etdump_path, args.debug_output_path,
                              args.debug_buffer_size)
            print(f"ETDump written to {etdump_path}; program outputs ({n} bytes) written to "
                  f"{args.debug_output_path}.", file=out)
        elif req.dump_level == "intermediates":
            program.write_etdump_result_to_file(etdump_path, args.debug_output_path)
            n = program.tracer.sink.used_bytes
            print(f"ETDump written to {etdump_path}; intermediate outputs ({n} bytes) written to "
                  f"{args.debug_output_path}.", file=out)
        else:
            program.write_etdump_result_to_file(etdump_path)
            print(f"ETDump written to {etdump_path}.", file=out)
    except OSError as e:
        raise CliError(f"cannot write the ETDump or debug buffer {e.filename or etdump_path}: "
                       f"{e.strerror or e}") from None
    except EdgeTorchError as e:
        raise RunFailed(str(e)) from None


def _verify(args: argparse.Namespace, method_name: str, flat_out: list, expected: list) -> int:
    """Compares the outputs with the bundled expected ones; prints the error statistics; the exit status."""
    out = sys.stdout
    if len(flat_out) != len(expected):
        print(f"Bundle verification failed: method '{method_name}' returned {len(flat_out)} output(s), "
              f"the test case expects {len(expected)}.", file=out)
        return EXIT_VERIFY_FAILED
    checks = [compare_output(j, a, e, args.rtol, args.atol) for j, (a, e) in enumerate(zip(flat_out, expected))]
    bad = [c for c in checks if not c.ok]
    if bad:
        print(f"Bundle verification failed (rtol={args.rtol:g}, atol={args.atol:g}): {len(bad)} of "
              f"{len(checks)} output(s) differ. Error statistics:", file=out)
    else:
        print(f"Model verified successfully (rtol={args.rtol:g}, atol={args.atol:g}). Error statistics:",
              file=out)
    for c in checks:
        print(c.line(), file=out)
    out.flush()
    return EXIT_VERIFY_FAILED if bad else EXIT_OK


def _main(args: argparse.Namespace) -> int:
    out = sys.stdout
    req = _check_args(args)
    from edgetorch.cli.run_reference import reference_kind

    kind = reference_kind(req.path)
    if kind is not None:  # written by the reference ExecuTorch: its own runtime runs it
        return _run_reference(args, req.path, kind, req.etdump_path, req.dump_level, out)
    method_name, flat_inputs, expected = _read_test_case(args, req.path) if req.bundled else (None, None, None)
    program, method, load_s = _load(args, req, method_name)
    _check_buffer_size(args, method, req.dump_level)
    if flat_inputs is None:
        flat_inputs = _ones_inputs(method.plan)
        print(f"Inputs: {len(flat_inputs)} filled with ones", file=out)
    print(f"Running method {method.name}" + (f" (test case {args.testset_idx})" if req.bundled else ""), file=out)
    if req.etdump_path is not None and req.bundled:
        program.tracer.set_bundled_input_index(args.testset_idx)
    flat_out, outputs_per_run, times = _execute(args, method, flat_inputs, req.dump_level == "outputs")
    ms = 1000 * sum(times) / len(times)
    runs = f"{args.num_executions} executions, {ms:.2f} ms each on average" if args.num_executions > 1 \
        else f"{ms:.2f} ms"
    print(f"Model executed successfully ({runs}; load {1000 * load_s:.1f} ms).", file=out)
    if args.print_output:
        for j, v in enumerate(flat_out):
            print(f"Output {j}: {v}", file=out)
    if req.etdump_path is not None:
        _write_trace(args, req, program, method, outputs_per_run)
    if args.output_verification:
        return _verify(args, method.name, flat_out, expected)
    return EXIT_OK


def _run_reference(args: argparse.Namespace, path: str, kind: str, etdump_path: str | None,
                   dump_level: str | None, out: Any) -> int:
    from edgetorch.cli.run_reference import run_reference

    outputs, expected = run_reference(args, path, kind, etdump_path, dump_level, out)
    if args.print_output:
        for j, v in enumerate(outputs):
            print(f"Output {j}: {v}", file=out)
    if not args.output_verification:
        return EXIT_OK
    if expected is None or len(outputs) != len(expected):
        print(f"Bundle verification failed: {len(outputs)} output(s), the test case expects "
              f"{'none' if expected is None else len(expected)}.", file=out)
        return EXIT_VERIFY_FAILED
    checks = [compare_output(j, a, e, args.rtol, args.atol) for j, (a, e) in enumerate(zip(outputs, expected))]
    ok = all(c.ok for c in checks)
    print(("Model verified successfully" if ok else "Bundle verification failed") +
          f" (rtol={args.rtol:g}, atol={args.atol:g}). Error statistics:", file=out)
    for c in checks:
        print(c.line(), file=out)
    return EXIT_OK if ok else EXIT_VERIFY_FAILED


def run(args: argparse.Namespace) -> int:
    """Runs the command; prints a one-line ``error: ...`` (no traceback) and returns non-zero on failure."""
    return guarded(_main, args, {RunFailed: EXIT_RUN_FAILED})
