"""``edgetorch demo``: the main job on a built-in model, end to end.

export (+ ETRecord) → .pte → run with ETDump and every intermediate → compare final outputs with eager →
per-op numeric gaps → the gap table on the terminal → an HTML report.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="vit_tiny", help="zoo model (edgetorch.models.list_models()); "
                   "default vit_tiny, try vit_b_16")
    p.add_argument("--backend", default="auto", choices=["auto", "portable", "onnxruntime"],
                   help="where the ops run: portable (ATen kernels: gaps ~0) or onnxruntime (delegated: real "
                        "kernel differences); auto picks onnxruntime when available")
    p.add_argument("--out", default="edgetorch-demo", help="folder for the .pte, ETRecord, ETDump, report")
    p.add_argument("--distance", default="MSE", help="MSE, L1, SNR, COSINE, MAX_ABS or a metric registered with "
                   "comparators.register_comparator")
    p.add_argument("--rows", type=int, default=25, help="gap-table rows to print")


def _partitioners(backend: str) -> tuple[list, str]:
    if backend in ("auto", "onnxruntime"):
        try:
            from edgetorch.backends.onnxruntime import OrtPartitioner
        except ImportError:
            if backend == "onnxruntime":
                raise
            return [], "portable"
        return [OrtPartitioner()], "onnxruntime"
    return [], "portable"


def _check_args(args: argparse.Namespace) -> None:
    """Refuses bad arguments before any work starts (exit status 2)."""
    from edgetorch.cli._common import CliError, check_output_dir
    from edgetorch.models import list_models

    if args.model not in list_models():
        raise CliError(f"unknown --model {args.model!r}; zoo models: {', '.join(list_models())}")
    from edgetorch.devtools.inspector.comparators import metric_names

    if str(args.distance).upper() not in metric_names():
        raise CliError(f"--distance must be one of {', '.join(metric_names())}, got {args.distance!r}")
    args.distance = str(args.distance).upper()
    if args.rows < 0:
        raise CliError(f"--rows must be >= 0, got {args.rows}")
    check_output_dir(args.out, "--out")


def run(args: argparse.Namespace) -> int:
    """Runs the demo; a bad argument, path or full disk prints one ``error: ...`` line (exit 2), no traceback."""
    from edgetorch.cli._common import guarded

    def main(a: argparse.Namespace) -> int:
        _check_args(a)
        try:
            return _demo(a)
        except OSError as e:  # disk full (errno 28), a folder made read-only meanwhile: name the output folder
            from edgetorch.errors import ArtifactIOError

            raise ArtifactIOError(f"cannot write into --out {a.out}: {e.strerror or e}"
                                  + (f" ({e.filename})" if e.filename else "")) from None
    return guarded(main, args)


def _demo(args: argparse.Namespace) -> int:
    import torch

    from edgetorch.cli._table import Steps, print_culprits, print_gap_table, table_console
    from edgetorch.devtools import Inspector
    from edgetorch.devtools.report import write_report
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models import get_model
    from edgetorch.runtime import Runtime

    console = table_console()
    os.makedirs(args.out, exist_ok=True)
    paths = {k: os.path.join(args.out, v) for k, v in
             {"pte": "model.pte", "etrecord": "etrecord.bin", "etdump": "etdump.etdp",
              "debug": "debug_buffer.bin", "report": "report.html"}.items()}
    partitioners, backend = _partitioners(args.backend)
    with Steps(console, total=7) as steps:
        steps.next(f"building the model {args.model}")
        model, inputs = get_model(args.model)
        steps.next("torch.export")
        aten = torch.export.export(model, inputs)
        steps.next(f"to_edge_transform_and_lower ({backend})")
        epm = to_edge_transform_and_lower(aten, partitioner=partitioners, generate_etrecord=True)
        steps.next("to_executorch, saving the program and the ETRecord")
        et = epm.to_executorch()
        et.save(paths["pte"])
        etrecord = et.get_etrecord()
        etrecord.update_representative_inputs(inputs)
        etrecord.save(paths["etrecord"])
        steps.next("running with ETDump and a debug buffer")
        program = Runtime.get().load_program(paths["pte"], enable_etdump=True, debug_buffer_size="auto")
        runtime_out = program.load_method("forward").execute(*inputs)
        program.write_etdump_result_to_file(paths["etdump"], paths["debug"])
        with torch.no_grad():
            eager_out = model(*inputs)
        steps.next("computing numeric gaps (re-running the reference op by op)")
        inspector = Inspector(etdump_path=paths["etdump"], etrecord=paths["etrecord"],
                              debug_buffer_path=paths["debug"])
        df = inspector.calculate_numeric_gap(args.distance)
        steps.next("writing the HTML report")
        culprits = _culprits(inspector, df)
        cov = inspector.last_gap_coverage
        r = runtime_out[0] if isinstance(runtime_out, (list, tuple)) else runtime_out
        e = eager_out[0] if isinstance(eager_out, (list, tuple)) else eager_out
        mse = torch.mean((e.double() - r.double()) ** 2).item()
        write_report(paths["report"], df, inspector.to_dataframe(), title=f"edgetorch: {args.model} on {backend}",
                     summary={"model": args.model, "backend": backend, "final output MSE": f"{mse:.3e}",
                              "coverage": cov.summary(), "program": paths["pte"]},
                     etrecord=inspector.etrecord, culprits=culprits)
    close = torch.allclose(e, r, rtol=1e-3, atol=1e-5)
    console.print(f"{args.model} on {backend}: final output MSE {mse:.3e} "
                  f"({'match' if close else 'differ'} at rtol=1e-3, atol=1e-5)", highlight=False, markup=False)
    print_gap_table(console, df, f"numeric gap ({args.distance}) per op, execution order", args.rows,
                    "see the report")
    console.print(cov.summary(), highlight=False, markup=False)
    if df.attrs.get("observer_effect") is not None:
        from edgetorch.cli.inspect import observer_effect_line

        console.print(observer_effect_line(df.attrs["observer_effect"]), highlight=False)
    print_culprits(console, df, culprits, args.distance)
    console.print(f"report: {paths['report']}", highlight=False, markup=False)
    return 0


def _culprits(inspector: Any, df: Any) -> Any:
    """``find_culprits`` over the whole table (None when it cannot rank this table)."""
    from edgetorch.errors import EdgeTorchError

    try:
        return inspector.find_culprits(df, top=10)
    except EdgeTorchError:
        return None
