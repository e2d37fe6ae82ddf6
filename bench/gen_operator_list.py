"""Regenerates the operator allow-list in ``src/edgetorch/formats/operators.py`` from the installed torch.

The list is the op set the compiler can emit or an ETRecord reference graph can hold, nothing else:

* ATen overloads that are core ATen (``torch.Tag.core``: what ``to_edge`` decomposes to), that torch can
  decompose (``torch._decomp.decomposition_table``), that are compositions of other ATen ops
  (``CompositeImplicitAutograd``: what an ATen-level reference graph holds, e.g. ``linear``) or functional ops
  with an out variant (what ``to_edge`` leaves undecomposed, e.g. ``rand_like``), with their out variants and
  in-place forms;
* the ``quantized_decomposed`` Q/DQ ops (PT2E), the pure-Python ``torchao`` affine quantization primitives and
  every ``edgetorch::`` op (the low-bit linear kernels of ``runtime.lowbit``; a delegate call is torch's
  ``executorch_call_delegate`` higher-order op, no operator);

minus every op that reads or writes a file, makes storage the planner does not own, leaves memory
uninitialised, prints, or runs a kernel the runtime never needs (backward, sparse, nested, device-specific,
packed-weight kernels): see ``_EXCLUDED``. Usage: ``python bench/gen_operator_list.py`` (rewrites the list;
``tests/runtime/test_operator_registry.py`` checks every entry against the same safety rules).
"""

from __future__ import annotations

import importlib
import os
import re
import sys

import torch
import torch._decomp

# substrings of an op name (the part after "aten::") that exclude it
_EXCLUDED = (
    "backward", "from_file", "_print", "empty", "resize", "set_", "storage", "_nested", "nested_", "sobol",
    "pin_memory", "cudnn", "miopen", "mkldnn", "_mps", "mps_", "cufft", "_cslt", "sparse", "_foreach", "_fused_",
    "fbgemm", "_nnpack", "quantized_", "_make_per", "_make_dual", "_unpack_dual", "record_stream", "_test_",
    "_functionalize", "_propagate_xla", "_debug", "as_strided_", "_has_compatible", "_use_cudnn", "vulkan",
    "_cudnn", "_cummax_helper", "_cummin_helper", "_pack_padded", "to_padded", "_dimI", "_dimV", "_nnz",
    "_coalesce", "crow_indices", "col_indices", "ccol_indices", "row_indices", "q_per",
    "_convolution_mode", "_weight_int", "_dyn_quant", "_autocast", "_cast_", "_version", "_backward",
    "retain_grad", "requires_grad_", "_fw_primal", "_conj_physical", "_neg_view", "_lazy_clone",
    "_jagged", "_padded_dense", "_chunk_grad", "_to_cpu", "_flash_attention", "_efficient_attention", "_cudnn_",
    "_scaled_dot_product_flash", "_scaled_dot_product_efficient", "_scaled_dot_product_cudnn",
    "_scaled_dot_product_fused", "_triton", "_transformer_encoder", "_native_multi_head", "_masked_softmax",
    "_validate", "_sparse_", "_spdiags", "_fake_quant", "_copy_from",
)
_SAFE_STR_ARGS = {"approximate", "reduce", "rounding_mode", "side", "padding_mode", "mode", "equation", "indexing",
                  "interpolation", "reduction", "pad_mode", "padding_side", "norm", "UPLO", "driver", "padding",
                  "mapping_type"}
_EXTRA = {  # pure-Python ops of other namespaces (their module is imported before the lookup)
    "quantized_decomposed": "torch.ao.quantization.fx._decomposed",
    "torchao": "torchao.quantization.quant_primitives",
}
_TORCHAO = ("quantize_affine", "dequantize_affine", "choose_qparams_affine", "choose_scale_float8",
            "quantize_affine_float8_non_decomposed", "dequantize_affine_float8_non_decomposed")
_EDGETORCH = ("edgetorch.runtime",)  # modules defining the edgetorch:: ops
# ATen ops of the symbolic-shape and assertion machinery that export leaves in a graph (every overload)
_ATEN_EXTRA = ("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range",
               "sym_constrain_range_for_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset")


def _op(ns: str, name: str, overload: str):
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError):
        return None


def _safe_schema(op) -> bool:
    for a in op._schema.arguments:
        t = str(a.type)
        if "Storage" in t or "Stream" in t or (t.startswith("str") and a.name not in _SAFE_STR_ARGS):
            return False
    return True


def _has_out_variant(name: str) -> bool:
    """An ATen function with an ``.out`` form: a kernel of torch's ordinary functional family (what survives
    ``to_edge`` undecomposed, e.g. ``rand_like``), never a factory of storage or a utility."""
    packet = getattr(torch.ops.aten, name, None)
    return packet is not None and any(
        any(a.is_out for a in getattr(packet, ov)._schema.arguments) for ov in packet.overloads())


def _aten() -> set[str]:
    out = set()
    for s in torch._C._jit_get_all_schemas():
        if not s.name.startswith("aten::"):
            continue
        name, overload = s.name[6:], s.overload_name or "default"
        op = _op("aten", name, overload)
        if op is None or any(x in name for x in _EXCLUDED) or not _safe_schema(op):
            continue
        try:
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
        except RuntimeError:
            composite = False
        if torch.Tag.core in op.tags or op in torch._decomp.decomposition_table or composite or name in _ATEN_EXTRA \
                or (not op._schema.is_mutable and _has_out_variant(name)) \
                or re.fullmatch(r"__[a-z]+__", name):
            out.add(f"aten::{name}.{overload}")
    for name in _ATEN_EXTRA:  # some are not in the JIT schema list
        packet = getattr(torch.ops.aten, name, None)
        out.update(f"aten::{name}.{ov}" for ov in (packet.overloads() if packet is not None else ()))
    # the out variants and in-place forms of every functional overload kept
    for s in torch._C._jit_get_all_schemas():
        if not s.name.startswith("aten::"):
            continue
        name, overload = s.name[6:], s.overload_name or "default"
        base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
        op = _op("aten", name, overload)
        if op is None or any(x in name for x in _EXCLUDED) or not _safe_schema(op):
            continue
        outs = [a for a in op._schema.arguments if a.is_out]
        if outs and any(k.startswith(f"aten::{name}.") for k in out):
            out.add(f"aten::{name}.{overload}")
        elif base != name and any(k.startswith(f"aten::{base}.") for k in out):
            out.add(f"aten::{name}.{overload}")
    return out


def _others() -> set[str]:
    out = set()
    for ns, module in _EXTRA.items():
        importlib.import_module(module)
        for s in torch._C._jit_get_all_schemas():
            if s.name.startswith(ns + "::"):
                name = s.name.split("::")[1]
                if ns == "quantized_decomposed" or name in _TORCHAO:
                    out.add(f"{s.name}.{s.overload_name or 'default'}")
    for module in _EDGETORCH:  # every edgetorch:: op: the low-bit linear kernels
        importlib.import_module(module)
    out |= {f"{s.name}.{s.overload_name or 'default'}" for s in torch._C._jit_get_all_schemas()
            if s.name.startswith("edgetorch::")}
    return out


def render(entries: set[str]) -> str:
    by_op: dict[str, list[str]] = {}
    for e in entries:
        op, _, ov = e.rpartition(".")
        by_op.setdefault(op, []).append(ov)
    items = []
    for op, ovs in sorted(by_op.items()):
        cur = op
        for ov in sorted(ovs):
            if len(cur) + 1 + len(ov) > 116:  # a long entry goes on as another entry of the same op
                items.append(cur)
                cur = op
            cur += " " + ov
        items.append(cur)
    lines, cur = [], ""
    for it in items:
        if cur and len(cur) + 3 + len(it) > 116:
            lines.append(cur)
            cur = it
        else:
            cur = f"{cur} | {it}" if cur else it
    lines.append(cur)
    return "\n".join(lines)


def main() -> None:
    entries = _aten() | _others()
    path = os.path.join(os.path.dirname(__file__), "..", "src", "edgetorch", "formats", "operators.py")
    with open(path) as f:
        text = f.read()
    new = re.sub(r'(_LIST = """\n).*?(""")', lambda m: m.group(1) + render(entries) + "\n" + m.group(2), text,
                 flags=re.S)
    with open(path, "w") as f:
        f.write(new)
    print(f"{len(entries)} operators written to {os.path.normpath(path)}", file=sys.stderr)


if __name__ == "__main__":
    main()
