"""My INT8 model is off: which layer? Quantization debugging against the float model, on ResNet-18 and BERT.

For each model (random weights, no download): export it with a PT2E INT8 recipe and an ETRecord (which then holds
the float program too), run the .pte on the calibration samples with an ETDump and a debug buffer, and compare
every float op with the runtime (``calculate_numeric_gap(..., reference_graph="float")``): the accumulated
error, the error the op's own quantization adds (local), SQNR, TFLite's RMSE/scale, the weight error, and the
output noise each layer's own error causes. Then keep the worst layers in float (the recipe's
``quant_exclude_nodes``) and see what each step buys back.

    python examples/quantization_debugging.py                              # ResNet-18 and BERT, portable
    python examples/quantization_debugging.py --models bert --backend onnxruntime --samples 4
"""

from __future__ import annotations

import argparse
import os
import tempfile

import pandas as pd
import torch

from edgetorch.devtools import Inspector
from edgetorch.devtools.inspector.float_reference import output_impact, rank_quantization_culprits
from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, export
from edgetorch.runtime import Runtime
from edgetorch.workflows.quant_fallback import selective_fallback

COLUMNS = ["aot_ops", "module", "sqnr_db", "local_sqnr_db", "rmse_over_scale", "weight_sqnr_db", "output_impact"]


def resnet18(n: int) -> tuple[torch.nn.Module, list[tuple]]:
    from edgetorch.models import get_model

    model, _ = get_model("resnet18")
    g = torch.Generator().manual_seed(0)
    return model.eval(), [(torch.randn(1, 3, 224, 224, generator=g),) for _ in range(n)]


def bert(n: int) -> tuple[torch.nn.Module, list[tuple]]:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64)
    model = transformers.BertModel(config).eval()
    g = torch.Generator().manual_seed(0)
    return model, [(torch.randint(0, 100, (1, 12), generator=g), torch.ones(1, 12, dtype=torch.long))
                   for _ in range(n)]


def recipe_type(backend: str) -> PortableRecipeType | OrtRecipeType:
    if backend == "onnxruntime":
        return OrtRecipeType.INT8_STATIC_PER_CHANNEL
    return PortableRecipeType.INT8_STATIC_PER_CHANNEL


def which_layer(model: torch.nn.Module, samples: list[tuple], backend: str, out: str) -> pd.DataFrame:
    """Steps 1-3: quantize with an ETRecord, run with a debug buffer, compare against the float model; then
    how much output noise each layer's own error causes (its local error injected into the float model)."""
    session = export(model, samples, ExportRecipe.get_recipe(recipe_type(backend)), generate_etrecord=True)
    record = session.get_etrecord()                          # graph_map["float/forward"]: the float program
    record.update_representative_inputs(samples)             # every calibration sample: one run each below
    record.save(os.path.join(out, "model.etrecord"))
    program = Runtime.get().load_program(session.get_pte_buffer(), enable_etdump=True, debug_buffer_size="auto")
    method = program.load_method("forward")
    for sample in samples:
        method.execute(*sample)
    program.write_etdump_result_to_file(os.path.join(out, "model.etdp"), os.path.join(out, "model_debug.bin"))
    inspector = Inspector(etdump_path=os.path.join(out, "model.etdp"), etrecord=os.path.join(out, "model.etrecord"),
                          debug_buffer_path=os.path.join(out, "model_debug.bin"))
    table = inspector.calculate_numeric_gap("MSE", reference_graph="float")
    impact = output_impact(inspector)                       # {float handle: output noise / output signal}
    return table.assign(output_impact=[impact.get(h) for h in table["float_debug_handle"]])


def main(argv: list[str] | None = None) -> dict[str, pd.DataFrame]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="resnet18,bert", help="comma-separated: resnet18, bert")
    ap.add_argument("--backend", default="portable", choices=["portable", "onnxruntime"])
    ap.add_argument("--samples", type=int, default=4, help="calibration samples (also the debugged runs)")
    ap.add_argument("--fallback-layers", type=int, default=3, help="at most this many layers kept in float")
    args = ap.parse_args(argv)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_colwidth", 40)
    builders = {"resnet18": resnet18, "bert": bert}
    steps = {}
    for name in args.models.split(","):
        model, samples = builders[name](args.samples)
        with tempfile.TemporaryDirectory() as out:
            table = which_layer(model, samples, args.backend, out)
        print(f"\n== {name} ({args.backend}): {len(table)} float ops compared over {table.attrs['samples']} "
              "samples; which layer's INT8 adds the most error (lowest local SQNR first):")
        print(rank_quantization_culprits(table, top=5)[COLUMNS].to_string(index=False, float_format="%.3g"))
        print("which layer's error reaches the output most (output_impact: output noise / signal it causes):")
        worst = table[table["quantized"]].sort_values("output_impact", ascending=False).head(5)
        print(worst[COLUMNS].to_string(index=False, float_format="%.3g"))
        print("accumulated SQNR of the last float op compared:", f"{table['sqnr_db'].iloc[-1]:.2f} dB")
        report = selective_fallback(model, samples, recipe_type(args.backend), max_layers=args.fallback_layers)
        print("layers kept in float as blocks (op, its output, the inputs only it reads), step by step:")
        cols = ["step", "kept_float", "float_activations", "cosine", "accuracy_recovered", "latency_ms",
                "latency_vs_int8"]
        print(report.steps[cols].to_string(index=False, float_format="%.5f"))
        steps[name] = report.steps
    return steps


if __name__ == "__main__":
    main()
