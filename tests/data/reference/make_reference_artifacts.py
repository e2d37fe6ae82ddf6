"""Makes the reference ExecuTorch artifacts that edgetorch's readers are tested on (issue 26).

Run it with a separate virtual environment holding the pinned reference (never a dependency of edgetorch):

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 torchao==0.18.0 ruamel.yaml==0.19.1 PyYAML==6.0.4 \
        tabulate==0.10.0 numpy pandas flatbuffers
    /tmp/refvenv/bin/pip install --no-deps executorch==1.5.1
    /tmp/refvenv/bin/python tests/data/reference/make_reference_artifacts.py [OUT_DIR [MODEL,MODEL...]]

Per model and backend (``<name>`` = ``<model>_<backend>``) it writes to OUT_DIR (default: this folder):
``<name>.pte`` (the reference's exporter; for the MLP also ``<name>.bpte``, a bundled program with two test
cases), ``<name>.etdp`` + ``<name>_debug.bin.gz`` (one run of the reference's
Python runtime with ETDump and a debug buffer, so intermediate outputs are logged), ``<name>_etrecord.bin`` (the
reference's ETRecord, with representative inputs and reference outputs) and ``<name>_gaps.json``: the reference
Inspector's own ``calculate_numeric_gap`` tables (MSE and L1: handles, op names, gaps) and its event names, the
figures edgetorch's Inspector is compared against (``gaps_edge``: the same tables against the edge program, in the
files written since the llama was added; ``reference_failure``: the error where the reference Inspector raises).
``faults/`` holds planted faults (one parameter perturbed
before export, run by the reference runtime; ``index.json`` lists them with the reference Inspector's
largest-gap row; ``pte_faults``: the same noise written into a constant's bytes of the clean ``.pte``,
``pte_index.json``). ``llama`` is a KV-cache llama (caches as buffers written in place, one token per call);
``llama_tokens`` runs its programs once per token into one ETDump. Models are tiny (fixed seeds) so the files
stay small.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
from torch import nn

MODELS_SEED = 26


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool, self.relu = nn.MaxPool2d(2), nn.ReLU()
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = self.relu(self.conv2(x))
        x = torch.mean(x, dim=(2, 3))
        return self.fc(x)


class TinyMobileNet(nn.Module):
    """An inverted residual block as in MobileNetV2: expand, depthwise, project, residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.expand, self.bn1 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.dw, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16)
        self.project, self.bn3 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.act = nn.ReLU6()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn0(self.stem(x)))
        y = self.act(self.bn1(self.expand(x)))
        y = self.act(self.bn2(self.dw(y)))
        x = x + self.bn3(self.project(y))
        return self.head(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


class TinyViT(nn.Module):
    """Patch embedding, one pre-norm transformer encoder block (single-head attention, GELU MLP), mean pool."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, stride=4)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.1)
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, 4)
        self.scale = dim ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(1, 2) * self.scale, dim=-1)
        x = x + self.proj(att @ v)
        x = x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(self.ln3(x).mean(dim=1))


class TinyViT2H(TinyViT):
    """TinyViT with two attention heads: q, k, v come from an ``unbind`` and the heads are merged by a ``reshape``
    of a transposed tensor, as in ViT (XNNPACK splits the ``unbind`` and a dim-order clone appears)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) * (d // 2) ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, n, d))
        x = x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))
        return self.head(self.ln3(x).mean(dim=1))


class TinyLlama(nn.Module):
    """A KV-cache llama (llama_tiny-sized): token embedding, two pre-norm blocks (RMSNorm, rotary attention over
    key/value caches held as buffers and written in place at ``input_pos``, SwiGLU MLP), final norm, LM head; one
    token per call, so a generation is a sequence of calls whose state lives in the caches."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 2, layers: int = 2, hidden: int = 64,
                 max_seq: int = 8) -> None:
        super().__init__()
        self.heads, self.hd, self.n_layers = heads, dim // heads, layers
        self.emb = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(nn.RMSNorm(dim, eps=1e-5) for _ in range(2 * layers + 1))
        self.wqkv = nn.ModuleList(nn.Linear(dim, 3 * dim, bias=False) for _ in range(layers))
        self.wo = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(layers))
        self.w13 = nn.ModuleList(nn.Linear(dim, 2 * hidden, bias=False) for _ in range(layers))
        self.w2 = nn.ModuleList(nn.Linear(hidden, dim, bias=False) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        freqs = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.outer(torch.arange(max_seq).float(), freqs)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        self.register_buffer("mask", torch.full((max_seq, max_seq), float("-inf")).triu(1), persistent=False)
        for i in range(layers):
            self.register_buffer(f"k_cache{i}", torch.zeros(1, heads, max_seq, self.hd))
            self.register_buffer(f"v_cache{i}", torch.zeros(1, heads, max_seq, self.hd))

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a, b = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)  # (1, 1, dim)
        cos, sin, mask = self.cos[input_pos], self.sin[input_pos], self.mask[input_pos]
        for i in range(self.n_layers):
            q, k, v = self.wqkv[i](self.norms[2 * i](x)).view(1, 1, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            kc, vc = getattr(self, f"k_cache{i}"), getattr(self, f"v_cache{i}")
            kc[:, :, input_pos] = k
            vc[:, :, input_pos] = v
            att = torch.softmax(q @ kc.transpose(-2, -1) * self.hd ** -0.5 + mask, dim=-1)
            x = x + self.wo[i]((att @ vc).transpose(1, 2).reshape(1, 1, -1))
            g, u = self.w13[i](self.norms[2 * i + 1](x)).chunk(2, dim=-1)
            x = x + self.w2[i](nn.functional.silu(g) * u)
        return self.head(self.norms[-1](x))


#: the tokens of the llama's per-token runs (one call each, positions 0, 1, ...)
LLAMA_TOKENS = [5, 17, 42, 9]


def llama_inputs(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([[LLAMA_TOKENS[k]]]), torch.tensor([k])


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(MODELS_SEED)
    if name == "llama":
        return TinyLlama().eval(), llama_inputs(0)
    if name == "mlp":
        return TinyMLP().eval(), (torch.randn(2, 16),)
    if name == "mobilenet":
        m = TinyMobileNet()
        with torch.no_grad():
            for bn in (m.bn0, m.bn1, m.bn2, m.bn3):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
        return m.eval(), (torch.randn(1, 3, 16, 16),)
    if name == "vit":
        return TinyViT().eval(), (torch.randn(1, 3, 16, 16),)
    if name == "vit2h":
        return TinyViT2H().eval(), (torch.randn(1, 3, 16, 16),)
    m = TinyCNN()
    with torch.no_grad():  # non-trivial batch-norm statistics
        m.bn1.running_mean.uniform_(-0.5, 0.5)
        m.bn1.running_var.uniform_(0.5, 2.0)
    return m.eval(), (torch.randn(1, 3, 16, 16),)


def _jsonable(x):
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and x != x:
        return "nan"
    if isinstance(x, float) and x in (float("inf"), float("-inf")):
        return str(x)
    return x


def quantize(model: nn.Module, inputs: tuple) -> nn.Module:
    """PT2E INT8 (XNNPACK's symmetric per-channel config), calibrated on ``inputs``."""
    import executorch.kernels.quantized  # noqa: F401  (out variants of the Q/DQ ops for the portable kernels)
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    m = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    m(*inputs)
    return convert_pt2e(m)


def write_bundle(et, model: nn.Module, inputs: tuple, path: str) -> None:
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    cases = []
    for k in range(2):
        x = tuple(t + k for t in inputs)
        with torch.no_grad():
            cases.append(MethodTestCase(inputs=x, expected_outputs=(model(*x),)))
    bundle = BundledProgram(et, [MethodTestSuite(method_name="forward", test_cases=cases)])
    with open(path, "wb") as f:
        f.write(serialize_from_bundled_program_to_flatbuffer(bundle))


def gap_rows(df) -> list[dict]:
    return [{"aot_debug_handle": list(r["aot_debug_handle"]), "aot_ops": list(r["aot_ops"]),
             "runtime_ops": list(r["runtime_ops"]), "runtime_debug_handle": list(r["runtime_debug_handle"]),
             "gap": _jsonable(r["gap"])} for _, r in df.iterrows()]


def make(model_name: str, backend: str, out: str) -> None:
    if model_name == "llama":  # a stateful program is exported without autograd (its caches are written in place)
        with torch.no_grad():
            return _make(model_name, backend, out)
    return _make(model_name, backend, out)


def _tables(inspector, graph: str | None) -> tuple[dict, str | None]:
    """The reference Inspector's gap tables (MSE, L1) against ``graph`` (None: its default choice), or the
    error it raises (it fails on some programs: it pairs tensors of different shapes)."""
    try:
        return {m: gap_rows(inspector.calculate_numeric_gap(m, reference_graph=graph)) for m in ("MSE", "L1")}, None
    except ValueError as e:
        return {}, f"{type(e).__name__}: {e}"


def _make(model_name: str, backend: str, out: str) -> None:
    from executorch.devtools import Inspector
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    model, inputs = build(model_name.removesuffix("_int8"))
    name = f"{model_name}_{backend}"
    partitioner = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    if model_name.endswith("_int8"):
        model = quantize(model, inputs)
    aten = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(aten, partitioner=partitioner, generate_etrecord=True)
    et = edge.to_executorch()
    pte = os.path.join(out, f"{name}.pte")
    with open(pte, "wb") as f:
        f.write(et.buffer)
    etrecord = et.get_etrecord()
    etrecord.update_representative_inputs([inputs])
    with torch.no_grad():  # on a copy: a stateful model (the llama's caches) must keep its exported state
        expected = copy.deepcopy(model)(*inputs)
    etrecord.update_reference_outputs({"forward": [[expected.detach()]]})
    etrecord_path = os.path.join(out, f"{name}_etrecord.bin")
    etrecord.save(etrecord_path)
    if model_name == "mlp":  # a bundled program: two test cases with their expected outputs
        write_bundle(et, model, inputs, os.path.join(out, f"{name}.bpte"))

    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=(1 << 20) if model_name ==
                                         "llama" else 64 << 10)
    (result,) = program.load_method("forward").execute(list(inputs))
    etdp, dbg = os.path.join(out, f"{name}.etdp"), os.path.join(out, f"{name}_debug.bin")
    program.write_etdump_result_to_file(etdp, dbg)

    inspector = Inspector(etdump_path=etdp, etrecord=etrecord_path, debug_buffer_path=dbg)
    tables, failure = _tables(inspector, None)
    # the same with the edge program as the AOT reference (the graph edgetorch falls back to when the ATen
    # program lacks a handle: an unbind the edge program splits into several ops)
    tables_edge, failure_edge = _tables(inspector, "edge_dialect_exported_program")
    events = [[b.name, e.name, e.debug_handles if not isinstance(e.debug_handles, tuple) else
               list(e.debug_handles), e.is_delegated_op, e.delegate_backend_name]
              for b in inspector.event_blocks for e in b.events]
    with open(os.path.join(out, f"{name}_gaps.json"), "w") as f:
        json.dump({"model": model_name, "backend": backend, "executorch": _version(),
                   "output_max_abs_diff": float((result - expected).abs().max()),
                   "gaps": tables, "reference_failure": failure, "gaps_edge": tables_edge,
                   "reference_failure_edge": failure_edge, "events": _jsonable(events)}, f, indent=1)
    gzip_file(dbg)
    print(name, {k: len(v) for k, v in tables.items()}, "rows")


#: planted faults: (model, backend, parameters perturbed one at a time); XNNPACK runs log only delegate outputs,
#: so their debug buffers are small, and the portable CNN's (the largest) is left out
FAULTS = [("mlp", "portable", ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]),
          ("mlp", "xnnpack", ["fc1.weight", "fc2.weight", "fc3.weight", "fc3.bias"]),
          ("cnn", "xnnpack", ["conv1.weight", "bn1.weight", "conv2.weight", "fc.weight"]),
          ("mobilenet", "xnnpack", ["stem.weight", "expand.weight", "dw.weight", "head.weight"]),
          ("vit", "portable", ["patch.weight", "pos", "ln1.weight", "qkv.weight", "proj.weight", "fc1.weight",
                               "fc2.weight", "ln3.weight", "head.weight"]),
          ("vit2h", "xnnpack", ["patch.weight", "qkv.weight", "fc1.weight", "fc2.weight", "head.weight"])]


def make_extras(out: str) -> None:
    """``mlp_extras_etrecord.bin``: the portable MLP's record with an ``edge_after_transform`` graph (a transform
    pass given) and an extra recorded module ``aux`` (a Linear), as ``graph_map`` entries."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.pass_base import ExportPass

    model, inputs = build("mlp")
    edge = to_edge_transform_and_lower(torch.export.export(model, inputs), transform_passes=[ExportPass()],
                                       generate_etrecord=True)
    etrecord = edge.to_executorch().get_etrecord()
    torch.manual_seed(MODELS_SEED)
    etrecord.add_extra_export_modules({"aux": torch.export.export(nn.Linear(16, 4).eval(), inputs)})
    etrecord.update_representative_inputs([inputs])
    etrecord.save(os.path.join(out, "mlp_extras_etrecord.bin"))


def make_multimethod(out: str) -> None:
    """``mm_portable``: one program with methods ``forward`` (the MLP) and ``head`` (a Linear + tanh), each run
    once by the reference runtime into one ETDump (whose runs do not name their method); the ETRecord holds both
    edge programs, representative inputs of ``forward``."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    model, (x,) = build("mlp")
    torch.manual_seed(MODELS_SEED + 1)
    head = nn.Sequential(nn.Linear(16, 8), nn.Tanh()).eval()
    y = torch.randn(3, 16)
    programs = {"forward": torch.export.export(model, (x,)), "head": torch.export.export(head, (y,))}
    et = to_edge_transform_and_lower(programs, generate_etrecord=True).to_executorch()
    pte = os.path.join(out, "mm_portable.pte")
    with open(pte, "wb") as f:
        f.write(et.buffer)
    etrecord = et.get_etrecord()
    etrecord.update_representative_inputs([(x,)])
    etrecord.save(os.path.join(out, "mm_portable_etrecord.bin"))
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=64 << 10)
    outs = {"head": program.load_method("head").execute([y])[0].tolist(),
            "forward": program.load_method("forward").execute([x])[0].tolist()}
    stem = os.path.join(out, "mm_portable")
    program.write_etdump_result_to_file(stem + ".etdp", stem + "_debug.bin")
    gzip_file(stem + "_debug.bin")
    os.remove(pte)
    with open(stem + "_io.json", "w") as f:
        json.dump({"head_input": y.tolist(), "outputs": outs}, f)


class ViTB16(nn.Module):
    """ViT-B/16 (12 blocks, width 768, 12 heads, 224x224 inputs, 1000 classes), for the Inspector benchmark
    (``bench/bench_reference_inspector.py``); never committed (a 346 MB program, a 696 MB ETRecord)."""

    def __init__(self, d: int = 768, depth: int = 12, heads: int = 12) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 16, 16)
        self.pos = nn.Parameter(torch.randn(1, 196, d) * 0.02)
        self.blocks = nn.Sequential(*[_Block(d, heads) for _ in range(depth)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.ln(self.blocks(x)).mean(1))


class _Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) * (d // self.h) ** -0.5, dim=-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def make_vitb16(out: str) -> None:
    """``v.pte``, ``v_etrecord.bin``, ``v.etdp`` and ``v_debug.bin`` (a 1 GiB debug buffer) of an XNNPACK ViT-B/16
    in ``out``: the artifacts ``bench/bench_reference_inspector.py --dir OUT`` times (about 3 minutes and
    3.2 GB of memory)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    torch.manual_seed(0)
    m, x = ViTB16().eval(), torch.randn(1, 3, 224, 224)
    et = to_edge_transform_and_lower(torch.export.export(m, (x,)), partitioner=[XnnpackPartitioner()],
                                     generate_etrecord=True).to_executorch()
    with open(os.path.join(out, "v.pte"), "wb") as f:
        f.write(et.buffer)
    rec = et.get_etrecord()
    rec.update_representative_inputs([(x,)])
    rec.save(os.path.join(out, "v_etrecord.bin"))
    program = Runtime.get().load_program(os.path.join(out, "v.pte"), enable_etdump=True, debug_buffer_size=1 << 30)
    program.load_method("forward").execute([x])
    program.write_etdump_result_to_file(os.path.join(out, "v.etdp"), os.path.join(out, "v_debug.bin"))


def make_llama_tokens(out: str) -> None:
    """``llama_<backend>_tokens``: the llama's program (portable and XNNPACK) run once per token of
    ``LLAMA_TOKENS`` (positions 0, 1, ...: each call reads the caches the previous ones wrote) by one loaded
    program into one ETDump + gzipped debug buffer; ``_tokens.json`` holds the inputs and the runtime's logits
    (the eager model's too, run on the same tokens)."""
    from executorch.runtime import Runtime

    for backend in ("portable", "xnnpack"):
        model, _ = build("llama")
        program = Runtime.get().load_program(os.path.join(out, f"llama_{backend}.pte"), enable_etdump=True,
                                             debug_buffer_size=1 << 20)
        method = program.load_method("forward")
        runtime, eager = [], []
        for k in range(len(LLAMA_TOKENS)):
            runtime.append(method.execute(list(llama_inputs(k)))[0].tolist())
            with torch.no_grad():
                eager.append(model(*llama_inputs(k)).tolist())
        stem = os.path.join(out, f"llama_{backend}_tokens")
        program.write_etdump_result_to_file(stem + ".etdp", stem + "_debug.bin")
        gzip_file(stem + "_debug.bin")
        with open(stem + ".json", "w") as f:
            json.dump({"tokens": LLAMA_TOKENS, "runtime_logits": runtime, "eager_logits": eager}, f)


def make_multirun(out: str) -> None:
    """The portable MLP run three times by one loaded program, on three inputs (``mlp_portable_3runs.etdp`` +
    gzipped debug buffer; ``mlp_portable_3runs_inputs.json`` holds the inputs and the reference outputs)."""
    from executorch.runtime import Runtime

    model, (x,) = build("mlp")
    xs = [x, x * 0.5, x + 1.0]
    program = Runtime.get().load_program(os.path.join(out, "mlp_portable.pte"), enable_etdump=True,
                                         debug_buffer_size=64 << 10)
    method = program.load_method("forward")
    outs = [method.execute([xi])[0] for xi in xs]
    stem = os.path.join(out, "mlp_portable_3runs")
    program.write_etdump_result_to_file(stem + ".etdp", stem + "_debug.bin")
    gzip_file(stem + "_debug.bin")
    with open(stem + "_inputs.json", "w") as f:
        json.dump({"inputs": [xi.tolist() for xi in xs], "runtime_outputs": [o.tolist() for o in outs]}, f)


def make_fault(model_name: str, backend: str, param: str, out: str) -> dict:
    """One planted fault: ``param`` perturbed (5 % of its mean magnitude, seeded noise) before export, the
    program run by the reference runtime; the ETDump and the gzipped debug buffer are compared against the
    clean program's ETRecord. Also records the reference Inspector's answer: the row with the largest gap."""
    from executorch.devtools import Inspector
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    model, inputs = build(model_name)
    with torch.no_grad():
        p = model.get_parameter(param)
        g = torch.Generator().manual_seed(sum(map(ord, param)))
        p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    partitioner = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioner = [XnnpackPartitioner()]
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), partitioner=partitioner).to_executorch()
    name = f"{model_name}_{backend}"
    with open(os.path.join(out, f"{name}_etrecord.bin"), "rb"):
        pass  # the clean record, written by make()
    stem = os.path.join(out, "faults", f"{name}__{param}")
    pte = stem + ".pte"
    with open(pte, "wb") as f:
        f.write(et.buffer)
    program = Runtime.get().load_program(pte, enable_etdump=True, debug_buffer_size=64 << 10)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(stem + ".etdp", stem + "_debug.bin")
    inspector = Inspector(etdump_path=stem + ".etdp", etrecord=os.path.join(out, f"{name}_etrecord.bin"),
                          debug_buffer_path=stem + "_debug.bin")
    df = inspector.calculate_numeric_gap("MSE")
    top = df.iloc[int(df["gap"].map(lambda g: g[0]).values.argmax())]
    gzip_file(stem + "_debug.bin")
    os.remove(pte)
    return {"model": model_name, "backend": backend, "param": param, "etdump": os.path.basename(stem) + ".etdp",
            "debug_buffer": os.path.basename(stem) + "_debug.bin.gz",
            "reference_top1_by_gap": list(top["aot_debug_handle"]), "reference_rows": len(df)}


def _constant_layouts(p: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The byte layouts a float parameter may be stored in by the reference's exporters: as is, transposed (a
    linear's weight) and channels-last (XNNPACK's convolution weights)."""
    layouts = [("as is", p)]
    if p.dim() == 2:
        layouts.append(("transposed", p.t()))
    if p.dim() == 4:
        layouts.append(("channels last", p.permute(0, 2, 3, 1)))
    return layouts


def make_pte_fault(model_name: str, backend: str, param: str, out: str) -> dict | None:
    """One planted fault made in the clean ``<name>.pte`` itself: the bytes of ``param``'s constant (found by
    content, in the layout the exporter stored it; None if they are not stored once and whole, e.g. a
    batch-norm weight fused into a convolution, or a LayerNorm weight equal to another one, stored as one shared
    constant) get the noise ``make_fault`` adds before export, written back in place; the edited program runs on
    the reference runtime, debugged against the clean ETRecord."""
    from executorch.devtools import Inspector
    from executorch.runtime import Runtime

    name = f"{model_name}_{backend}"
    with open(os.path.join(out, f"{name}.pte"), "rb") as f:
        data = bytearray(f.read())
    model, inputs = build(model_name)
    p = model.get_parameter(param).detach()
    if any(n != param and q.shape == p.shape and torch.equal(q, p) for n, q in model.state_dict().items()):
        return None  # another tensor holds the same values: the exporter stores them as one constant
    g = torch.Generator().manual_seed(sum(map(ord, param)))
    noise = 0.05 * p.abs().mean() * torch.randn(p.shape, generator=g)
    for layout, view in _constant_layouts(p):
        raw = view.contiguous().numpy().tobytes()
        at = data.find(raw)
        if at >= 0 and data.find(raw, at + 1) < 0:
            break
    else:
        return None
    noisy = (p + noise)
    view = dict(_constant_layouts(noisy))[layout]
    data[at:at + len(raw)] = view.contiguous().numpy().tobytes()
    stem = os.path.join(out, "faults", f"{name}__{param}__pte")
    with open(stem + ".pte", "wb") as f:
        f.write(bytes(data))
    program = Runtime.get().load_program(stem + ".pte", enable_etdump=True, debug_buffer_size=64 << 10)
    program.load_method("forward").execute(list(inputs))
    program.write_etdump_result_to_file(stem + ".etdp", stem + "_debug.bin")
    inspector = Inspector(etdump_path=stem + ".etdp", etrecord=os.path.join(out, f"{name}_etrecord.bin"),
                          debug_buffer_path=stem + "_debug.bin")
    try:
        df = inspector.calculate_numeric_gap("MSE")
        top, failure = list(df.iloc[int(df["gap"].map(lambda gap: gap[0]).values.argmax())]["aot_debug_handle"]), None
    except ValueError as e:  # the reference Inspector pairs tensors of different shapes on some programs
        df, top, failure = (), None, f"{type(e).__name__}: {str(e)[:200]}"
    gzip_file(stem + "_debug.bin")
    os.remove(stem + ".pte")
    return {"model": model_name, "backend": backend, "param": param, "layout": layout, "pte_offset": at,
            "etdump": os.path.basename(stem) + ".etdp", "debug_buffer": os.path.basename(stem) + "_debug.bin.gz",
            "reference_top1_by_gap": top, "reference_failure": failure, "reference_rows": len(df)}


#: faults made in the clean .pte: every FAULTS parameter, plus the portable CNN and MobileNet and a few biases
PTE_FAULTS = FAULTS + [("cnn", "portable", ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight",
                                            "fc.bias"]),
                       ("mlp", "xnnpack", ["fc1.bias", "fc2.bias"]),
                       ("mobilenet", "portable", ["stem.weight", "expand.weight", "dw.weight", "project.weight",
                                                  "head.weight"]),
                       ("vit2h", "xnnpack", ["pos", "proj.weight", "qkv.bias"])]


def _clean_run_error(name: str, model_name: str, out: str) -> float:
    """The largest absolute difference between the clean ``<name>.pte`` run by the reference runtime and eager."""
    from executorch.runtime import Runtime

    model, inputs = build(model_name)
    got = Runtime.get().load_program(os.path.join(out, f"{name}.pte")).load_method("forward").execute(list(inputs))
    with torch.no_grad():
        return float((got[0] - model(*inputs)).abs().max())


def make_pte_faults(out: str) -> None:
    """``faults/pte_index.json``: each ``PTE_FAULTS`` parameter whose constant the clean program stores once and
    whole, perturbed in the ``.pte`` (``make_pte_fault``). Skipped, with the reason: a parameter not stored whole
    (fused), and every parameter of a program whose clean run already differs from eager by more than 1e-4 (a
    plant there would not be the only fault)."""
    os.makedirs(os.path.join(out, "faults"), exist_ok=True)
    made, skipped, wrong = [], [], {}
    for m, b, params in PTE_FAULTS:
        name = f"{m}_{b}"
        if name not in wrong:
            wrong[name] = _clean_run_error(name, m, out)
        for param in params:
            f = None if wrong[name] > 1e-4 else make_pte_fault(m, b, param, out)
            (made.append(f) if f else skipped.append(f"{name}:{param}"))
    with open(os.path.join(out, "faults", "pte_index.json"), "w") as f:
        json.dump({"faults": made, "skipped": skipped, "clean_run_max_abs_error": wrong}, f, indent=1)
    print(len(made), "faults made in the .pte,", len(skipped), "skipped:", skipped, "clean runs:", wrong)


def gzip_file(path: str) -> None:
    """Replaces ``path`` by ``path.gz`` (reproducible: no time stamp); the reference writes the whole debug
    buffer, zero tail included, which compresses to almost nothing."""
    import gzip

    with open(path, "rb") as f, open(path + ".gz", "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as z:
        z.write(f.read())
    os.remove(path)


def make_faults(out: str) -> None:
    os.makedirs(os.path.join(out, "faults"), exist_ok=True)
    index = [make_fault(m, b, p, out) for m, b, params in FAULTS for p in params]
    with open(os.path.join(out, "faults", "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(len(index), "faults")


def _version() -> str:
    from importlib.metadata import version

    return version("executorch")


#: the single-head ViT is kept portable only; the two-head one XNNPACK only (the reference Inspector raises
#: ValueError on its portable program: comparing tensors of different shapes)
_BACKENDS = {"vit": ("portable",), "vit2h": ("xnnpack",)}


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out, exist_ok=True)
    everything = ["mlp", "cnn", "mobilenet", "vit", "vit2h", "cnn_int8", "faults", "multirun", "extras",
                  "multimethod", "llama", "llama_tokens", "pte_faults"]
    models = sys.argv[2].split(",") if len(sys.argv) > 2 else everything
    for model_name in models:
        if model_name == "faults":
            make_faults(out)
            continue
        if model_name == "pte_faults":
            make_pte_faults(out)
            continue
        if model_name == "multirun":
            make_multirun(out)
            continue
        if model_name == "vitb16":  # the benchmark's artifacts (large: never part of the default list)
            make_vitb16(out)
            continue
        if model_name == "llama_tokens":
            make_llama_tokens(out)
            continue
        if model_name == "extras":
            make_extras(out)
            continue
        if model_name == "multimethod":
            make_multimethod(out)
            continue
        for backend in _BACKENDS.get(model_name, ("portable", "xnnpack")):
            make(model_name, backend, out)


if __name__ == "__main__":
    main()
