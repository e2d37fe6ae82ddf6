"""Hugging Face models through the whole flow: the sweep table and BERT-base against ViT-B/16.

``--sweep``: BERT, DistilBERT, GPT-2, Llama, Qwen2, the T5 encoder and ViT from small configs (random weights),
called as users call them (``attention_mask=``, ``use_cache=False`` keyword inputs; ModelOutput results), each
through export -> portable and ONNX Runtime lowering -> run (max error vs eager) -> ETRecord save/parse ->
debug run -> Inspector gap table; one line per model and backend with stage times, rows and coverage.

``--flow``: export -> ORT program -> debug run -> Inspector gaps for BERT-base (sequence 128, full-size config)
and for the zoo's ViT-B/16, each in a fresh process; prints both wall times and their ratio.

    python bench/bench_hf.py --sweep
    python bench/bench_hf.py --flow
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.utils._pytree as pytree


def _models(full_bert: bool = False) -> dict:
    import transformers as T

    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 16, dtype=torch.long)
    small = dict(num_hidden_layers=2, num_attention_heads=4)
    dec = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_key_value_heads=2,
               max_position_embeddings=64, **small)
    return {
        "bert": (lambda: T.BertModel(T.BertConfig(vocab_size=100, hidden_size=32, intermediate_size=64, **small)),
                 (ids,), {"attention_mask": mask}),
        "distilbert": (lambda: T.DistilBertModel(T.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4,
                                                                    hidden_dim=64)), (ids,), {"attention_mask": mask}),
        "gpt2": (lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                        bos_token_id=0, eos_token_id=0)), (ids,), {"use_cache": False}),
        "llama": (lambda: T.LlamaForCausalLM(T.LlamaConfig(**dec)), (ids,), {"use_cache": False}),
        "qwen2": (lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**dec)), (ids,), {"use_cache": False}),
        "t5_encoder": (lambda: T.T5EncoderModel(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                           num_heads=4)), (ids,), {}),
        "vit": (lambda: T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                               **small)), (torch.randn(1, 3, 32, 32),), {}),
    }


def _flow(model, args: tuple, kwargs: dict, ort: bool, folder: str) -> dict:
    from edgetorch.devtools import Inspector
    from edgetorch.devtools.etrecord import parse_etrecord
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.runtime import Runtime

    t = {}
    t0 = time.perf_counter()
    ep = torch.export.export(model, args, kwargs)
    t["export"] = time.perf_counter() - t0
    parts = None
    if ort:
        from edgetorch.backends.onnxruntime import OrtPartitioner

        parts = [OrtPartitioner()]
    t0 = time.perf_counter()
    et = to_edge_transform_and_lower(ep, partitioner=parts, generate_etrecord=True).to_executorch()
    pte, rec_path = os.path.join(folder, "m.pte"), os.path.join(folder, "rec.bin")
    et.save(pte)
    t["lower+emit"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    rec = et.get_etrecord()
    rec.update_representative_inputs(pytree.tree_leaves((args, kwargs)))
    rec.save(rec_path)
    parse_etrecord(rec_path)
    t["etrecord"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prog = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size="auto")
    out = prog.load_method("forward").execute(*args, **kwargs)
    prog.write_etdump_result_to_file(os.path.join(folder, "e.etdp"), os.path.join(folder, "d.bin"))
    t["debug run"] = time.perf_counter() - t0
    with torch.no_grad():
        want = pytree.tree_leaves(model(*args, **kwargs))
    err = max(((o.double() - w.double()).abs().max().item() for o, w in zip(out, want)
               if isinstance(o, torch.Tensor) and o.is_floating_point()), default=0.0)
    t0 = time.perf_counter()
    insp = Inspector(etdump_path=os.path.join(folder, "e.etdp"), etrecord=rec_path,
                     debug_buffer_path=os.path.join(folder, "d.bin"))
    df = insp.calculate_numeric_gap("MSE")
    t["inspector"] = time.perf_counter() - t0
    return {"times": t, "err": err, "rows": len(df), "coverage": insp.last_gap_coverage.summary()}


def sweep() -> None:
    for name, (build, args, kwargs) in _models().items():
        torch.manual_seed(0)
        model = build().eval()
        for ort in (False, True):
            with tempfile.TemporaryDirectory() as d:
                r = _flow(model, args, kwargs, ort, d)
            times = ", ".join(f"{k} {v:.2f}s" for k, v in r["times"].items())
            print(f"{name:11s} {'ort' if ort else 'portable':8s} {times}; max err vs eager {r['err']:.1e}; "
                  f"{r['rows']} gap rows; {r['coverage']}", flush=True)


def _flow_child(which: str) -> None:
    torch.manual_seed(0)
    if which == "bert":
        import transformers as T

        model = T.BertModel(T.BertConfig()).eval()  # BERT-base: 12 layers, hidden 768
        ids = torch.randint(0, 30000, (1, 128), generator=torch.Generator().manual_seed(1))
        args, kwargs = (ids,), {"attention_mask": torch.ones(1, 128, dtype=torch.long)}
    else:
        from edgetorch.models import get_model

        model, args = get_model("vit_b_16")
        kwargs = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        r = _flow(model, args, kwargs, True, d)
    print(f"RESULT {which} {time.perf_counter() - t0:.2f} " +
          " ".join(f"{k}={v:.2f}" for k, v in r["times"].items()) + f" rows={r['rows']}", flush=True)


def flow() -> None:
    totals = {}
    for which in ("bert", "vit_b_16"):
        r = subprocess.run([sys.executable, __file__, "--child", which], capture_output=True, text=True)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")), None)
        if line is None:
            print(r.stderr[-3000:])
            raise SystemExit(1)
        print(line[7:], flush=True)
        totals[which] = float(line.split()[2])
    print(f"BERT-base (seq 128) flow / ViT-B/16 flow = {totals['bert'] / totals['vit_b_16']:.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--flow", action="store_true")
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        _flow_child(a.child)
    elif a.flow:
        flow()
    else:
        sweep()
