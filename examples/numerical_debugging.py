"""Pipeline 1 of the numerical-debugging tutorial, step for step with edgetorch names.

Export ViT-B/16 (random weights, from the repo's zoo) with an ETRecord, lower it (to ONNX Runtime when the
backend is installed), run it in the Python runtime with an ETDump and a debug buffer, compare the final
outputs, then find the ops whose outputs drift with ``Inspector.calculate_numeric_gap``.

    python examples/numerical_debugging.py                 # ViT-B/16
    python examples/numerical_debugging.py --model vit_tiny --backend portable

Gaps are printed in scientific notation: they are often 1e-14 and below, which pandas' default 6 decimals
(and its formatting of the one-element lists the ``gap`` column holds) would print as ``[0.0]``. Step 6 asks
which ops add error beyond their rounding noise; step 7 writes the HTML report (graph, table, culprits).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import pandas as pd
import torch
from torch.export import ExportedProgram, export

from edgetorch.devtools import Inspector
from edgetorch.devtools.report import write_report
from edgetorch.exir import ExecutorchProgramManager, to_edge_transform_and_lower
from edgetorch.models import get_model
from edgetorch.runtime import Method, Program, Runtime, Verification


def partitioners(backend: str) -> list:
    if backend == "portable":
        return []
    from edgetorch.backends.onnxruntime import OrtPartitioner

    return [OrtPartitioner()]


COLUMNS = ["aot_ops", "runtime_ops", "gap", "local_gap", "rel_error", "local_rel_error", "noise_floor", "verdict",
           "source"]


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """The gap table with scalar gaps (``[x]`` -> ``x``), the columns worth reading and the source file name."""
    flat = df.assign(gap=df["gap"].str[0], local_gap=df["local_gap"].str[0],
                     source=df["source"].str.replace(r"^[^:]*/", "", regex=True))
    return flat[[c for c in COLUMNS if c in flat.columns]]


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="vit_b_16")
    ap.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "portable"])
    ap.add_argument("--out", default=None, help="folder for the artifacts (default: a temporary folder)")
    args = ap.parse_args(argv)

    # Step 1: export the model and generate an ETRecord
    model, model_inputs = get_model(args.model)
    model = model.eval()
    temp_dir = args.out or tempfile.mkdtemp()
    os.makedirs(temp_dir, exist_ok=True)
    aten_model: ExportedProgram = export(model, model_inputs, strict=True)
    edge_program_manager = to_edge_transform_and_lower(
        aten_model,
        partitioner=partitioners(args.backend),
        generate_etrecord=True,
    )
    et_program_manager: ExecutorchProgramManager = edge_program_manager.to_executorch()
    pte_path = os.path.join(temp_dir, "model.pte")
    et_program_manager.save(pte_path)
    etrecord = et_program_manager.get_etrecord()
    etrecord.update_representative_inputs(model_inputs)
    etrecord_path = os.path.join(temp_dir, "etrecord.bin")
    etrecord.save(etrecord_path)

    # Step 2: run the model with an ETDump and a debug buffer
    et_runtime: Runtime = Runtime.get()
    program: Program = et_runtime.load_program(
        pte_path,
        verification=Verification.Minimal,
        enable_etdump=True,
        debug_buffer_size=1024 * 1024 * 1024,  # 1 GB, as in the tutorial ("auto" sizes it exactly)
    )
    forward: Method = program.load_method("forward")
    runtime_outputs = forward.execute(*model_inputs)
    etdump_path = os.path.join(temp_dir, "etdump.etdp")
    debug_buffer_path = os.path.join(temp_dir, "debug_buffer.bin")
    program.write_etdump_result_to_file(etdump_path, debug_buffer_path)

    # Step 3: compare the final outputs
    with torch.no_grad():
        eager_output = model(*model_inputs)
    runtime_output = runtime_outputs[0] if isinstance(runtime_outputs, (list, tuple)) else runtime_outputs
    mse = torch.mean((eager_output - runtime_output) ** 2).item()
    print(f"Final output MSE: {mse}")
    if torch.allclose(eager_output, runtime_output, rtol=1e-3, atol=1e-5):
        print("Outputs match within tolerance!")
    else:
        print("Outputs differ - proceeding with operator-level analysis...")

    # Step 4: operator-level debugging
    inspector = Inspector(etdump_path=etdump_path, etrecord=etrecord_path, debug_buffer_path=debug_buffer_path)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", None)
    pd.set_option("display.max_colwidth", 60)
    pd.set_option("display.float_format", "{:.3e}".format)  # gaps of 1e-14 must not print as 0.000000
    df: pd.DataFrame = inspector.calculate_numeric_gap("MSE")
    print(readable(df))

    # Step 5: the ops with the largest gaps, and those above a threshold
    df_sorted = df.sort_values(by="gap", ascending=False,
                               key=lambda x: x.apply(lambda y: y[0] if isinstance(y, list) else y))
    print("Top 5 operators with largest numerical discrepancies:")
    print(readable(df_sorted.head(5)))
    threshold = 1e-4
    problematic_ops = df[df["gap"].apply(lambda x: x[0] > threshold if isinstance(x, list) else x > threshold)]
    print(f"\nOperators with MSE > {threshold:.0e}:")
    if problematic_ops.empty:
        print(f"none (the largest accumulated MSE is {df_sorted['gap'].iloc[0][0]:.3e})")
    else:
        print(readable(problematic_ops))
    print(inspector.last_gap_coverage.summary())

    # Step 6: which ops add error of their own, beyond the rounding noise of their dtype? (The largest gaps
    # above are accumulated: they sit downstream of the op that caused them.)
    culprits = inspector.find_culprits(df)
    print("\nOps adding error beyond their rounding noise:")
    print(readable(culprits) if len(culprits) else "none: every op is within noise (or exact)")

    # Step 7: the HTML report: the edge graph coloured by the error each op adds, the table, the culprits
    report = write_report(os.path.join(temp_dir, "report.html"), df, inspector.to_dataframe(),
                          etrecord=inspector.etrecord, culprits=culprits)
    print(f"report: {report}")
    return df


if __name__ == "__main__":
    main()
