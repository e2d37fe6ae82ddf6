"""Clean recordings made by the documented commands and snippets: the debugger must name nothing (issue 24).

Each recording is made the way the README makes it (``edgetorch demo``, ``edgetorch generate --etdump``, the
README's Python snippets, a Hugging Face model from a small config, an INT8 program inspected against itself), then
read twice:

- **CLI**: ``edgetorch inspect --gap`` (``--execution all`` for a generation), in a fresh process; its culprit lines
  are counted and its stderr must be empty (no third-party warning, no library noise);
- **Python**: ``Inspector.find_culprits(calculate_numeric_gap(...))`` on every execution, and
  ``first_divergence_across_executions`` for generations (threshold: the README's 1e-10 on the portable runtime,
  whose kernels are ATen's own; 1e-6 on ONNX Runtime, whose kernels round differently).

Target: 0 culprits and no divergence everywhere; exit status 1 otherwise.

    python bench/bench_clean_recordings.py [--only NAME[,NAME]] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "edgetorch"]
FILES = ("etdump.etdp", "etrecord.bin", "debug_buffer.bin")


def _cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=1800)


def _check(r: subprocess.CompletedProcess, what: str) -> None:
    if r.returncode not in (0, 1):
        raise RuntimeError(f"{what} exited {r.returncode}: {r.stderr[-2000:]}")


# -- recordings: each writes etdump.etdp, etrecord.bin, debug_buffer.bin into its folder -----------------------

def _demo(model: str, backend: str) -> Callable[[str], None]:
    def make(out: str) -> None:
        r = _cli("demo", "--model", model, "--backend", backend, "--out", out)
        _check(r, "demo")
    return make


def _generate(*extra: str) -> Callable[[str], None]:
    def make(out: str) -> None:
        _check(_cli("generate", "--tokens", "16", "--etdump", "--out", out, *extra), "generate")
    return make


def _save_run(out: str, et, inputs, run) -> None:  # noqa: ANN001 - a program manager, inputs, a run(method) callable
    import torch  # noqa: F401

    from edgetorch.runtime import Runtime

    pte = os.path.join(out, "model.pte")
    et.save(pte)
    rec = et.get_etrecord()
    if inputs is not None:
        rec.update_representative_inputs(inputs)
    rec.save(os.path.join(out, "etrecord.bin"))
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    run(program)
    program.write_etdump_result_to_file(os.path.join(out, "etdump.etdp"), os.path.join(out, "debug_buffer.bin"))


def _readme_llama(out: str) -> None:
    """The README's "Debugging an LLM across generated tokens" snippet (the eager model run before saving)."""
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models.generation import greedy_generate_with_logits
    from edgetorch.models.llama import build_llama_tiny, example_prompt, export_llama

    model = build_llama_tiny()
    et = to_edge_transform_and_lower(export_llama(model), generate_etrecord=True).to_executorch()
    prompt = example_prompt(model.config, 6)
    greedy_generate_with_logits(model.prefill, model.decode, prompt, 4)  # eager first: must change nothing

    def run(program) -> None:  # noqa: ANN001
        prefill, decode = program.load_method("prefill"), program.load_method("decode")
        greedy_generate_with_logits(prefill.execute, decode.execute, prompt, 8)
    _save_run(out, et, None, run)


def _hf(name: str, ort: bool) -> Callable[[str], None]:
    def make(out: str) -> None:
        import torch
        import transformers

        from edgetorch.exir import to_edge_transform_and_lower

        class TupleOut(torch.nn.Module):
            def __init__(self, model: torch.nn.Module) -> None:
                super().__init__()
                self.model = model

            def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
                return self.model(input_ids, use_cache=False, return_dict=False)

        torch.manual_seed(0)
        if name == "gpt2":
            cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                          bos_token_id=0, eos_token_id=0)
            model = TupleOut(transformers.GPT2LMHeadModel(cfg)).eval()
        else:
            cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
            model = TupleOut(transformers.LlamaForCausalLM(cfg)).eval()
        inputs = (torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1)),)
        kw = {}
        if ort:
            from edgetorch.backends.onnxruntime import OrtPartitioner
            kw["partitioner"] = [OrtPartitioner()]
        et = to_edge_transform_and_lower(torch.export.export(model, inputs), generate_etrecord=True,
                                         **kw).to_executorch()
        _save_run(out, et, inputs, lambda p: p.load_method("forward").execute(*inputs))
    return make


def _int8(backend: str) -> Callable[[str], None]:
    def make(out: str) -> None:
        from edgetorch.export import ExportRecipe, OrtRecipeType, PortableRecipeType, export
        from edgetorch.models import get_model

        model, inputs = get_model("small_cnn")
        recipe = (ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_TENSOR) if backend == "portable"
                  else ExportRecipe.get_recipe(OrtRecipeType.INT8_STATIC_PER_CHANNEL))
        session = export(model, [inputs], recipe, generate_etrecord=True)
        et = session.get_executorch_program_manager()
        _save_run(out, et, inputs, lambda p: p.load_method("forward").execute(*inputs))
    return make


RECORDINGS: dict[str, tuple[Callable[[str], None], bool, str]] = {
    # name: (maker, is a generation, backend)
    "demo_vit_tiny_portable": (_demo("vit_tiny", "portable"), False, "portable"),
    "demo_vit_tiny_ort": (_demo("vit_tiny", "onnxruntime"), False, "onnxruntime"),
    "demo_mobilenet_v2_ort": (_demo("mobilenet_v2", "onnxruntime"), False, "onnxruntime"),
    "demo_resnet18_portable": (_demo("resnet18", "portable"), False, "portable"),
    "generate_portable": (_generate(), True, "portable"),
    "generate_ort": (_generate("--backend", "onnxruntime"), True, "onnxruntime"),
    "generate_8da4w_portable": (_generate("--recipe", "portable_torchao_8da4w"), True, "portable"),
    "readme_llama_snippet": (_readme_llama, True, "portable"),
    "hf_gpt2_portable": (_hf("gpt2", False), False, "portable"),
    "hf_gpt2_ort": (_hf("gpt2", True), False, "onnxruntime"),
    "hf_llama_ort": (_hf("llama", True), False, "onnxruntime"),
    "int8_cnn_portable": (_int8("portable"), False, "portable"),
    "int8_cnn_ort": (_int8("onnxruntime"), False, "onnxruntime"),
}


# -- reading them -------------------------------------------------------------------------------------------

def _cli_count(out: str, generation: bool) -> tuple[int, str]:
    args = ["inspect", *sum(([f"--{k}", os.path.join(out, f)] for k, f in
                             zip(("etdump", "etrecord", "debug-buffer"), FILES)), []), "--gap", "--rows", "3"]
    if generation:
        args += ["--execution", "all"]
    r = _cli(*args)
    _check(r, "inspect")
    if generation:
        per_call = [int(n) for n in re.findall(r"; (\d+) culprit", r.stdout)]
        culprits = sum(per_call) if per_call else -1
    else:
        culprits = 0 if "no op adds error of its own" in r.stdout else \
            len(re.findall(r"^\s+row \d+ .*× noise", r.stdout, flags=re.M)) or -1
    return culprits, r.stderr.strip()


def _python_count(out: str, generation: bool, backend: str) -> tuple[int, object]:
    from edgetorch.devtools import Inspector

    insp = Inspector(etdump_path=os.path.join(out, FILES[0]), etrecord=os.path.join(out, FILES[1]),
                     debug_buffer_path=os.path.join(out, FILES[2]))
    if not generation:
        return len(insp.find_culprits(insp.calculate_numeric_gap("MSE"))), None
    culprits = sum(len(insp.find_culprits(insp.calculate_numeric_gap("MSE", execution=k)))
                   for k in range(len(insp.executions)))
    threshold = 1e-10 if backend == "portable" else 1e-6
    return culprits, insp.first_divergence_across_executions(threshold)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="comma-separated recording names")
    ap.add_argument("--keep", default=None, help="folder to keep the recordings in")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(RECORDINGS)
    base = args.keep or tempfile.mkdtemp(prefix="clean-recordings-")
    bad = 0
    print(f"{'recording':28} {'cli culprits':>12} {'py culprits':>11} {'divergence':>10}  stderr   seconds")
    for name in names:
        make, generation, backend = RECORDINGS[name]
        out = os.path.join(base, name)
        os.makedirs(out, exist_ok=True)
        t0 = time.perf_counter()
        make(out)
        cli_n, stderr = _cli_count(out, generation)
        py_n, div = _python_count(out, generation, backend)
        ok = cli_n == 0 and py_n == 0 and div is None and not stderr
        bad += not ok
        print(f"{name:28} {cli_n:>12} {py_n:>11} {'none' if div is None else 'YES':>10}  "
              f"{'clean' if not stderr else 'NOISE':6} {time.perf_counter() - t0:8.1f}", flush=True)
        if stderr:
            print("   stderr: " + stderr[:500].replace("\n", "\n           "))
        if div is not None:
            print(f"   divergence: {div}")
    print(f"{len(names) - bad}/{len(names)} clean recordings with 0 culprits, no divergence, nothing on stderr")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
