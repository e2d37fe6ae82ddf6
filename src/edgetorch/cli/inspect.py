"""``edgetorch inspect``: the profile table or the per-op numeric-gap table of an ETDump (+ ETRecord).

    edgetorch inspect --etdump etdump.etdp [--etrecord etrecord.bin]              # profile table
    edgetorch inspect --etdump etdump.etdp --etrecord etrecord.bin --debug-buffer debug_output.bin --gap MSE
                      [--tsv gaps.tsv] [--report report.html] [--model-explorer-json nodes.json] [--method forward]
    edgetorch inspect ... --gap --reference-graph float        # an INT8 program against its float model
    edgetorch inspect ... --gap --execution 3                  # call 3 of a recording (`edgetorch generate --etdump`)
    edgetorch inspect ... --gap --execution all                # one line per call, then the first call's culprits

``--execution K`` replays the reference on the inputs every call logged (a debug buffer records them), the mutable
buffers (KV caches) carried from call to call, and compares call K (``Inspector.calculate_numeric_gap(
execution=K)``); ``all`` checks every call. Without it, a method whose ETRecord holds no representative input is
compared on the inputs its run logged, the same way.

``--reference-graph float`` (a program exported with a quantization recipe, whose ETRecord holds the float model)
prints one row per float op over every recorded sample: the accumulated and the local SQNR (the error the op's
own quantization adds), TFLite's RMSE/scale and the weight's SQNR, then the worst layers; ``--report`` adds the
quantization section (``edgetorch.devtools.report``).

The gap table prints gaps in scientific notation, source lines with their file name, and the culprits (ops
adding error beyond their rounding noise); ``--report`` adds the edge graph (``edgetorch.devtools.report``).

Exit status: 0 success, 2 bad arguments or unreadable/mismatched artifacts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from edgetorch.cli._common import CliError, check_output_path, guarded

__all__ = ["EXIT_OK", "add_arguments", "observer_effect_line", "run"]

EXIT_OK = 0  # 2: bad arguments or artifacts, 3: any other failure (edgetorch.cli._common)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--etdump", "--etdump_path", dest="etdump", required=True, help="ETDump file (.etdp)")
    p.add_argument("--etrecord", "--etrecord_path", dest="etrecord", default=None,
                   help="ETRecord file (needed for --gap; adds op types and source lines to the profile)")
    p.add_argument("--debug-buffer", "--debug_buffer_path", dest="debug_buffer", default=None,
                   help="debug buffer file written with the ETDump (needed for --gap)")
    p.add_argument("--gap", metavar="DISTANCE", nargs="?", const="MSE", default=None, type=str.upper,
                   help="print the per-op numeric-gap table with this distance (MSE, L1, SNR, COSINE, MAX_ABS or a "
                        "metric registered with comparators.register_comparator; default MSE)")
    p.add_argument("--reference-graph", dest="reference_graph", default=None, metavar="NAME",
                   help="with --gap: compare with this graph of the ETRecord instead of the edge program; 'float' "
                        "(the float model a quantizing export records) gives each layer's quantization error over "
                        "every recorded sample")
    p.add_argument("--float-model", dest="float_model", default=None, metavar="NAME",
                   help="with --reference-graph float: the zoo model a low-bit `generate --recipe ... --etdump` "
                        "recording was quantized from: per token and per layer, its quantization error (default: "
                        "the float program the ETRecord of a torchao-recipe export holds)")
    p.add_argument("--worst", type=int, default=5, metavar="N",
                   help="with --reference-graph float: how many worst layers to list (default 5)")
    p.add_argument("--impact", action="store_true",
                   help="with --reference-graph float: also measure what each layer's own error alone does to the "
                        "model's output (injected into the float model: one float forward per layer and sample)")
    p.add_argument("--method", default=None, help="method to analyse (default forward, or the only one run)")
    p.add_argument("--run", type=int, default=0, help="which run of --method to analyse (default 0)")
    p.add_argument("--execution", default=None, metavar="K|all",
                   help="with --gap (MSE when not given): analyse call K of the whole recording (any method; "
                        "earlier calls replayed, KV caches carried over), or every call ('all')")
    p.add_argument("--rows", type=int, default=40, help="table rows to print (default 40; 0 = all)")
    p.add_argument("--tsv", default=None, help="also write the table (profile or gaps) as TSV")
    p.add_argument("--report", default=None, help="write the HTML report (culprits, edge graph, gap table, profile)")
    p.add_argument("--model-explorer-json", dest="model_explorer_json", metavar="PATH", default=None,
                   help="with --gap: write the per-node values as Model Explorer node data (overlay them on the "
                        "ATen program's graph there)")


def _check_input(path: str | None, flag: str) -> None:
    if path is None:
        return
    if not os.path.exists(path):
        raise CliError(f"{flag} file not found: {path}")
    if os.path.isdir(path):
        raise CliError(f"{flag} {path} is a directory")


def _check_output(path: str | None, flag: str) -> None:
    if path is not None:
        check_output_path(path, flag)


def observer_effect_line(effect: float) -> str:
    """One line on how much exposing delegate intermediates changed the delegate's final outputs."""
    from edgetorch.formats.etdump import OBSERVER_EFFECT_TOLERANCE

    if effect > OBSERVER_EFFECT_TOLERANCE:
        return (f"observer effect {effect:.3g} relative (> {OBSERVER_EFFECT_TOLERANCE:g}): exposing the delegate's "
                "intermediates changed what it computes; inside-delegate rows show the observed variant")
    return (f"observer effect {effect:.3g} relative (<= {OBSERVER_EFFECT_TOLERANCE:g}): the delegate computes the "
            "same with its intermediates exposed")


def _tsv(flat: Any) -> bytes:
    """A table as TSV bytes, list cells joined with ", "."""
    for c in flat.columns:
        flat[c] = flat[c].apply(lambda v: ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else v)
    return flat.to_csv(sep="\t", index_label="row").encode()


def _gap_tsv(df: Any) -> bytes:
    cols = ["aot_ops", "runtime_ops", "gap", "local_gap", "aot_debug_handle", "runtime_debug_handle",
            "instruction_id", "delegate", "shape", "source", "module"]
    flat = df[[c for c in cols if c in df.columns]].copy()
    for c in ("gap", "local_gap"):
        if c in flat.columns:
            flat[c] = flat[c].apply(lambda v: v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v)
    return _tsv(flat)


def _check_args(args: argparse.Namespace) -> None:
    """Refuses bad or contradictory arguments (CliError, exit status 2) before anything is read."""
    _check_input(args.etdump, "--etdump")
    _check_input(args.etrecord, "--etrecord")
    _check_input(args.debug_buffer, "--debug-buffer")
    args.execution = _execution_arg(args.execution)
    if args.execution is not None and args.gap is None:
        args.gap = "MSE"
    if args.gap is not None:
        from edgetorch.devtools.inspector.comparators import metric_names

        if args.gap not in metric_names():
            raise CliError(f"--gap must be one of {', '.join(metric_names())}, got {args.gap}")
        if args.etrecord is None:
            raise CliError("--gap needs --etrecord (the reference graph and its representative inputs)")
        if args.debug_buffer is None:
            raise CliError("--gap needs --debug-buffer (the runtime's intermediate outputs)")
    if args.run < 0:
        raise CliError(f"--run must be >= 0, got {args.run}")
    if args.worst < 1:
        raise CliError(f"--worst must be >= 1, got {args.worst}")
    _check_output(args.tsv, "--tsv")
    _check_output(args.report, "--report")
    _check_output(args.model_explorer_json, "--model-explorer-json")
    if args.model_explorer_json and args.gap is None:
        raise CliError("--model-explorer-json needs --gap (the per-op values it exports)")
    if args.impact and args.reference_graph is None:
        raise CliError("--impact needs --gap --reference-graph float")
    if args.reference_graph is not None:
        if args.gap is None:
            raise CliError("--reference-graph needs --gap (it picks what the gap table compares with)")
        if args.reference_graph == "float" and args.run != 0:
            raise CliError("--run picks one execution; --reference-graph float uses every recorded sample")
        if args.impact and args.reference_graph != "float":
            raise CliError("--impact needs --reference-graph float (it injects each layer's quantization error "
                           "into the float model)")
        if args.reference_graph == "float" and args.model_explorer_json:
            raise CliError("--model-explorer-json overlays edge-program rows; it cannot take the float-model table "
                           "of --reference-graph float")


def _main(args: argparse.Namespace) -> int:
    _check_args(args)
    from edgetorch.cli._table import Steps, print_culprits, table_console
    from edgetorch.devtools.inspector import Inspector
    from edgetorch.errors import EdgeTorchError

    if args.gap is None and args.debug_buffer is None and not getattr(args, "verbose", False):
        import logging  # the profile needs no tensors: do not warn that the debug buffer is missing

        logging.getLogger("edgetorch.devtools.inspector.inspector").setLevel(logging.ERROR)
    console = table_console()  # piped / captured: wide enough for the tables
    steps = Steps(console, total=1 + (args.gap is not None) + bool(args.report) + bool(args.impact))
    try:
        with steps:
            steps.next("reading the ETDump" + (" and the ETRecord" if args.etrecord else ""))
            inspector = Inspector(etdump_path=args.etdump, etrecord=args.etrecord,
                                  debug_buffer_path=args.debug_buffer)
    except (EdgeTorchError, OSError) as e:
        raise CliError(str(e)) from None
    methods = inspector.methods
    method = args.method
    if method is not None and method not in methods:
        raise CliError(f"the ETDump has no execution of method '{method}' (methods run: {', '.join(methods)})")
    if method is None:
        method = "forward" if "forward" in methods or not methods else methods[0]

    gap_df, culprits, quant_df, generation_df = None, None, None, None
    if args.gap is not None and args.reference_graph == "float" and (getattr(args, "float_model", None)
                                                                      or _is_low_bit(inspector)):
        from edgetorch.cli import _quant_generation as qg

        qdf = qg.print_quantized_generation(inspector, args.float_model, console, impact=args.impact)
        if args.report:
            qg.write_quantized_generation_report(args.report, inspector, qdf, args.etdump, console)
        return EXIT_OK
    if args.gap is not None and args.reference_graph == "float":
        quant_df = _float_table(inspector, args, method, console, steps)
    elif args.gap is not None:
        try:
            if args.execution == "all":
                gap_df, culprits, generation_df = _every_execution(inspector, args, console, steps)
            else:
                gap_df = _gap_table(inspector, args, method, steps)
        except EdgeTorchError as e:
            raise CliError(str(e)) from None
        if gap_df is not None:
            method = gap_df.attrs.get("method", method)
            _print_gaps(console, inspector, gap_df, args, method)
            culprits = _culprits(inspector, gap_df) if args.execution != "all" else culprits
            print_culprits(console, gap_df, culprits, args.gap)
            _float_hint(console, inspector, method, args.reference_graph)
    else:
        inspector.print_data_tabular(file=sys.stdout, rows=args.rows)

    _write_outputs(args, inspector, console, steps, method, (gap_df, culprits, quant_df, generation_df))
    return EXIT_OK


_QUANT_TSV = ("aot_ops", "module", "sqnr_db", "local_sqnr_db", "rmse_over_scale", "output_scale", "weight_sqnr_db",
              "weight_mse", "output_impact", "gap", "local_gap", "quantized", "samples", "float_debug_handle",
              "source", "shape")


def _quant_tsv(df: Any) -> bytes:
    flat = df[[c for c in _QUANT_TSV if c in df.columns]].copy()
    return _tsv(flat)


def _is_low_bit(inspector: Any) -> bool:
    """Whether the recording's program holds low-bit layers (a torchao recipe): compared per token and layer."""
    from edgetorch.devtools.inspector.quantized_generation import has_low_bit_layers
    from edgetorch.errors import EdgeTorchError

    try:
        return has_low_bit_layers(inspector)
    except EdgeTorchError:
        return False


def _float_table(inspector: Any, args: argparse.Namespace, method: str, console: Any, steps: Any) -> Any:
    """Computes and prints the per-layer table against the float model and its worst layers."""
    from edgetorch.cli._quant_table import print_output_impact, print_quant_table, print_worst_layers
    from edgetorch.devtools.inspector.culprits import float_culprits
    from edgetorch.devtools.inspector.float_reference import float_graph, with_output_impact
    from edgetorch.errors import EdgeTorchError

    try:
        with steps:
            steps.next(f"computing {args.gap} quantization errors of '{method}' against the float model (every "
                       "recorded sample)")
            df = inspector.calculate_numeric_gap(args.gap, method=method, reference_graph="float")
        if args.impact:
            with steps:
                steps.next(f"injecting each of the {len(df)} layers' own error into the float model (one float "
                           "forward per layer and sample)")
                df = with_output_impact(inspector, df, method)
    except EdgeTorchError as e:
        hint = ("; a low-bit (torchao recipe) generation is compared per token and layer with --float-model NAME "
                "(the zoo model it was quantized from)") if "holds no float program" in str(e) else ""
        raise CliError(f"{e}{hint}") from None
    ranked = float_culprits(df, args.worst)  # find_culprits' answer on this table: the one the report gives
    pos = {label: k for k, label in enumerate(df.index)}
    print_quant_table(console, df, f"quantization error per float op of '{method}' against the float model, graph "
                      f"order ({df.attrs.get('samples')} sample(s); * worst)", args.rows,
                      {pos[i] for i in ranked.index})
    print_worst_layers(console, df, ranked, float_graph(inspector, method))
    _signal_lines(console, ranked)
    if args.impact:
        print_output_impact(console, df, args.worst)
    if inspector.observer_effect is not None:  # a delegate's values came from its exposing session
        console.print(observer_effect_line(inspector.observer_effect), highlight=False, markup=False)
    return df


def _signal_lines(console: Any, found: Any) -> None:
    """What ``find_culprits`` on the float table adds (``found``: its answer): where the output is lost, and the
    rows without a float signal that the ranking sets apart."""
    if found.attrs.get("lost_from"):
        console.print(f"the output is lost from {found.attrs['lost_from']} on (accumulated SQNR <= 0 dB)",
                      highlight=False, markup=False)
    apart = found.attrs.get("no_signal")
    silent = [] if apart is None else [i for i, r in zip(apart.index, apart["reason"]) if r.startswith("no float")]
    if silent:
        names = ", ".join(str(apart.at[i, "module"] or apart.at[i, "aot_ops"][0]) for i in silent[:5])
        console.print(f"{len(silent)} row(s) without a float signal (local SQNR -inf: the float output is zero there) "
                      f"are not ranked: {names}{' ...' if len(silent) > 5 else ''}", highlight=False, markup=False)


def _float_hint(console: Any, inspector: Any, method: str, reference_graph: str | None) -> None:
    """When the ETRecord holds the float model of a quantized program and the table compared with the edge
    program, says how to compare with the float model."""
    rec = inspector.etrecord
    if reference_graph is None and rec is not None and f"float/{method}" in rec.graph_map_names():
        console.print("this program was quantized from the float model the ETRecord holds: --reference-graph float "
                      "shows what each layer's quantization costs", highlight=False, markup=False)


def _report_float_table(inspector: Any, args: argparse.Namespace, method: str, console: Any) -> Any:
    """For the report of a quantized program whose ETRecord holds its float model (``--gap`` without
    ``--reference-graph``, one execution, the first run): the float-reference table, so that the report leads
    with the float-model ranking (the program compared with itself follows); None otherwise or when it fails."""
    from edgetorch.errors import EdgeTorchError

    rec = inspector.etrecord
    if (args.reference_graph is not None or args.execution is not None or args.run != 0 or rec is None
            or f"float/{method}" not in rec.graph_map_names()):
        return None
    try:
        df = inspector.calculate_numeric_gap(args.gap, method=method, reference_graph="float")
    except EdgeTorchError as e:
        console.print(f"the report has no float-model section: {e}", highlight=False, markup=False)
        return None
    console.print("the report leads with the float-model ranking (as --reference-graph float)", highlight=False,
                  markup=False)
    return df


def _culprits(inspector: Any, gap_df: Any) -> Any:
    """``find_culprits`` over the whole table (None when it cannot rank this table)."""
    from edgetorch.errors import EdgeTorchError

    try:
        return inspector.find_culprits(gap_df, top=10)
    except EdgeTorchError:
        return None


def _generation_gaps(inspector: Any, distance: str) -> Any:
    """The final-output gap per execution when the ETDump holds several calls with their inputs (and the
    ETRecord and debug buffer were given), else None."""
    from edgetorch.errors import InspectorError

    if inspector.etrecord is None or len(inspector.executions) < 2:
        return None
    try:
        return inspector.generation_gaps(distance)
    except InspectorError:
        return None  # inputs not logged (an older ETDump) or no debug buffer: no replay


def _execution_arg(value: str | None) -> int | str | None:
    if value is None or value.lower() == "all":
        return None if value is None else "all"
    try:
        k = int(value)
    except ValueError:
        raise CliError(f"--execution must be a call index (0, 1, ...) or 'all', got {value!r}") from None
    if k < 0:
        raise CliError(f"--execution must be >= 0, got {k}")
    return k


def _logged_execution(inspector: Any, method: str, run: int) -> int | None:
    """The call index of run ``run`` of ``method`` when the ETDump logged its inputs (a debug buffer), else None."""
    from edgetorch.errors import InspectorError

    try:
        executions = inspector.executions
    except InspectorError:
        return None
    for ex in executions:
        if ex.method == method and ex.run == run:
            return ex.index if inspector.replay(None).records[ex.index].inputs is not None else None
    return None


def _gap_table(inspector: Any, args: argparse.Namespace, method: str, steps: Any) -> Any:
    """The gap table of one call: ``--execution K``, else run ``--run`` of ``method`` on its representative input
    (the bundled test case it ran), or on the inputs it logged when the ETRecord holds none."""
    if args.execution is None:
        rec = inspector.etrecord
        blocks = [b for b in inspector.event_blocks if b.method == method and b.name != "load"]
        idx = blocks[0].bundled_input_index if blocks else None
        reps = (getattr(rec, "representative_inputs", None) or {}).get(method) or []
        if idx is not None and args.run == 0 and idx < len(reps):
            with steps:  # the run used bundled test case `idx`: compare against the same inputs
                steps.next(f"computing {args.gap} numeric gaps of '{method}' (re-running the reference graph op "
                           "by op)")
                return inspector.calculate_numeric_gap(args.gap, method=method, run=args.run, inputs=reps[idx],
                                                       reference_graph=args.reference_graph)
        if args.run < len(reps) or args.reference_graph is not None:
            with steps:
                steps.next(f"computing {args.gap} numeric gaps of '{method}' (re-running the reference graph op "
                           "by op)")
                return inspector.calculate_numeric_gap(args.gap, method=method, run=args.run,
                                                       reference_graph=args.reference_graph)
        args.execution = _logged_execution(inspector, method, args.run)
        if args.execution is None:  # the Inspector's own error: no representative input
            return inspector.calculate_numeric_gap(args.gap, method=method, run=args.run)
    with steps:
        steps.next(f"computing {args.gap} numeric gaps of call {args.execution} (replaying the calls before it on "
                   "their logged inputs)")
        return inspector.calculate_numeric_gap(args.gap, execution=args.execution,
                                               reference_graph=args.reference_graph)


def _print_gaps(console: Any, inspector: Any, gap_df: Any, args: argparse.Namespace, method: str) -> None:
    from edgetorch.cli._table import print_gap_table

    ex = gap_df.attrs.get("execution")
    where = f"'{method}'" if ex is None else f"call {ex} ('{method}' run {gap_df.attrs.get('run')})"
    print_gap_table(console, gap_df, f"numeric gap ({args.gap}) per op of {where}, execution order", args.rows,
                    "--rows 0 shows all")
    if inspector.last_gap_coverage is not None:
        console.print(inspector.last_gap_coverage.summary(), highlight=False, markup=False)
    if gap_df.attrs.get("observer_effect") is not None:
        console.print(observer_effect_line(gap_df.attrs["observer_effect"]), highlight=False)


def _every_execution(inspector: Any, args: argparse.Namespace, console: Any, steps: Any) -> tuple[Any, Any, Any]:
    """``--execution all``: one line per call (final-output gap, worst local gap, culprits); returns the gap table
    and culprits of the first call with a culprit (else of the last call), and the per-call table."""
    from edgetorch.cli._table import sci

    n = len(inspector.executions)
    with steps:
        steps.next(f"computing {args.gap} numeric gaps of all {n} calls (replaying them on their logged inputs)")
        per_call = inspector.generation_gaps(args.gap)
        tables = [inspector.calculate_numeric_gap(args.gap, execution=k) for k in range(n)]
    found = [_culprits(inspector, df) for df in tables]
    counts = [0 if c is None else len(c) for c in found]
    console.print(f"numeric gap ({args.gap}) per call: final output against the replayed reference",
                  highlight=False, markup=False)
    for row, count in zip(per_call.itertuples(), counts):
        worst = "" if row.worst_op is None else f", worst op {', '.join(row.worst_op)}"
        console.print(f"  call {row.execution:>3} {row.method:<10} run {row.run:>3}: output gap "
                      f"{sci(row.output_gap) or '-'}, worst local gap {sci(row.worst_local_gap) or '0'}{worst}; "
                      f"{count} culprit(s)", highlight=False, markup=False)
    first = next((k for k, c in enumerate(counts) if c), None)
    console.print(f"no culprit in any of the {n} calls" if first is None else
                  f"first call with a culprit: {first} ({sum(1 for c in counts if c)} of {n} calls have one)",
                  highlight=False, markup=False)
    k = n - 1 if first is None else first
    return tables[k], found[k], per_call


def _write_outputs(args: argparse.Namespace, inspector: Any, console: Any, steps: Any, method: str,
                   tables: tuple[Any, Any, Any, Any]) -> None:
    """Writes the TSV, the HTML report and the Model Explorer node data that were asked for."""
    gap_df, culprits, quant_df, generation_df = tables
    try:
        if args.tsv:
            if gap_df is not None or quant_df is not None:
                from edgetorch._fileio import atomic_write

                atomic_write(args.tsv, [_gap_tsv(gap_df) if gap_df is not None else _quant_tsv(quant_df)])
            else:
                inspector.save_data_to_tsv(args.tsv)
            console.print(f"TSV written to {args.tsv}")
        if args.report:
            from edgetorch.devtools.report import write_report

            if quant_df is None and gap_df is not None:
                quant_df = _report_float_table(inspector, args, method, console)
            with steps:
                steps.next("writing the HTML report")
                summary = {"ETDump": args.etdump, "ETRecord": args.etrecord or "", "method": method}
                if quant_df is not None:
                    summary["reference" if gap_df is None else "first section against"] = (
                        "the float model (graph_map['float/" + method + "'])")
                    if inspector.observer_effect is not None:
                        summary["observer effect"] = observer_effect_line(inspector.observer_effect)
                if gap_df is not None and inspector.last_gap_coverage is not None:
                    summary["coverage"] = inspector.last_gap_coverage.summary()
                if generation_df is None and args.reference_graph != "float":
                    generation_df = _generation_gaps(inspector, args.gap or "MSE")
                write_report(args.report, gap_df, inspector.to_dataframe(), summary=summary,
                             title=f"edgetorch inspect: {os.path.basename(args.etdump)}",
                             generation_df=generation_df,
                             etrecord=inspector.etrecord if gap_df is not None else None,
                             culprits=culprits if gap_df is not None else None, quant_df=quant_df)
            console.print(f"report written to {args.report}", highlight=False, markup=False)
        if args.model_explorer_json and gap_df is not None:
            from edgetorch.devtools.model_explorer import write_node_data

            write_node_data(args.model_explorer_json, gap_df)
            console.print(f"Model Explorer node data written to {args.model_explorer_json}", highlight=False,
                          markup=False)
    except OSError as e:
        raise CliError(f"cannot write output: {e.strerror or e}: {e.filename or ''}") from None


def run(args: argparse.Namespace) -> int:
    """Runs the command; prints a one-line ``error: ...`` (no traceback) and returns non-zero on failure."""
    return guarded(_main, args)
