"""Pipeline 2 of the numerical-debugging tutorial: export in Python, run with the command-line runner, analyse
in Python.

Step 1: export the model (ViT-B/16 by default, random weights from the repo's zoo) and lower it (to ONNX
Runtime when installed), with an ETRecord. Step 2: package the program, its test input and the eager output
as a bundled program (.bpte). Step 3: run it with ``edgetorch run --bundled_program_path ...
--output_verification --dump_intermediate_outputs --debug_buffer_size auto`` (a separate process, as the C++
example runner would be). Step 4: load the ETDump, the debug buffer and the ETRecord in the Inspector and
list the ops with the largest numeric gaps.

    python examples/numerical_debugging_cli.py                              # ViT-B/16
    python examples/numerical_debugging_cli.py --model vit_tiny --backend portable
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import pandas as pd
import torch
from torch.export import ExportedProgram, export

from edgetorch.devtools import BundledProgram, Inspector
from edgetorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
from edgetorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
from edgetorch.exir import ExecutorchProgramManager, to_edge_transform_and_lower
from edgetorch.models import get_model


def partitioners(backend: str) -> list:
    if backend == "portable":
        return []
    try:
        from edgetorch.backends.onnxruntime import OrtPartitioner
    except ImportError:
        if backend == "onnxruntime":
            raise
        return []
    return [OrtPartitioner()]


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b_16", help="zoo model (default vit_b_16; vit_tiny is quick)")
    ap.add_argument("--backend", default="auto", choices=["auto", "onnxruntime", "portable"],
                    help="auto: ONNX Runtime when installed, else the portable kernels")
    ap.add_argument("--out", default=None, help="folder for the artifacts (default: a temporary folder)")
    args = ap.parse_args(argv)

    # Step 1: export the model and generate an ETRecord
    model, model_inputs = get_model(args.model)
    model = model.eval()
    temp_dir = args.out or tempfile.mkdtemp()
    os.makedirs(temp_dir, exist_ok=True)
    aten_model: ExportedProgram = export(model, model_inputs, strict=True)
    edge_program_manager = to_edge_transform_and_lower(aten_model, partitioner=partitioners(args.backend),
                                                       generate_etrecord=True)
    et_program_manager: ExecutorchProgramManager = edge_program_manager.to_executorch()
    etrecord = et_program_manager.get_etrecord()
    etrecord.update_representative_inputs(model_inputs)
    etrecord_path = os.path.join(temp_dir, "etrecord.bin")
    etrecord.save(etrecord_path)

    # Step 2: the bundled program, with the same inputs as the ETRecord's representative inputs
    m_name = "forward"
    test_inputs = [model_inputs]
    with torch.no_grad():
        method_test_suites = [MethodTestSuite(
            method_name=m_name,
            test_cases=[MethodTestCase(inputs=inp, expected_outputs=model(*inp)) for inp in test_inputs],
        )]
    bundled_program = BundledProgram(et_program_manager, method_test_suites)
    serialized_bundled_program = serialize_from_bundled_program_to_flatbuffer(bundled_program)
    bundled_program_path = os.path.join(temp_dir, "bundled_program.bpte")
    with open(bundled_program_path, "wb") as f:  # (bundled_program.save(path) streams and writes atomically)
        f.write(serialized_bundled_program)

    # Step 3: run it with the command-line runner, verifying outputs and dumping every intermediate output
    etdump_path = os.path.join(temp_dir, "etdump.etdp")
    debug_buffer_path = os.path.join(temp_dir, "debug_output.bin")
    cmd = [sys.executable, "-m", "edgetorch", "run", "--bundled_program_path", bundled_program_path,
           "--output_verification", "--dump_intermediate_outputs", "--debug_buffer_size", "auto",
           "--etdump_path", etdump_path, "--debug_output_path", debug_buffer_path]
    print("$ edgetorch " + " ".join(cmd[3:]), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    print(result.stdout, end="")
    if result.returncode == 1:  # verification failed: exactly what the next step explains
        print("Outputs differ - proceeding with operator-level analysis...")
    elif result.returncode != 0:
        raise SystemExit(f"edgetorch run failed (exit {result.returncode}): {result.stderr.strip()}")

    # Step 4: analyse the results in Python
    inspector = Inspector(etdump_path=etdump_path, etrecord=etrecord_path, debug_buffer_path=debug_buffer_path)
    pd.set_option("display.width", 100000)
    pd.set_option("display.max_columns", None)
    pd.set_option("display.float_format", "{:.3e}".format)  # gaps of 1e-14 must not print as 0.000000
    df = inspector.calculate_numeric_gap("MSE")
    flat = df.assign(gap=df["gap"].str[0], local_gap=df["local_gap"].str[0])  # [x] -> x: pandas formats x
    print("Top operators with largest gaps:")
    print(flat.sort_values("gap", ascending=False)[["aot_ops", "runtime_ops", "gap", "local_gap"]].head(5))
    print(inspector.last_gap_coverage.summary())
    culprits = inspector.find_culprits(df)
    print("Ops adding error beyond their rounding noise:",
          ", ".join(", ".join(ops) for ops in culprits["aot_ops"]) or "none (every op is within noise or exact)")
    print("the same analysis from the command line: edgetorch inspect --etdump", etdump_path, "--etrecord",
          etrecord_path, "--debug-buffer", debug_buffer_path, "--gap MSE --report report.html")
    return df


if __name__ == "__main__":
    main()
