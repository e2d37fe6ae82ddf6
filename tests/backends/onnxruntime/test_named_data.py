"""Named data on the onnxruntime backend: a program whose methods lower the same weights to ORT stores each
weight once (``PreprocessResult.data_store_output``), its delegates read them from the program at load time, and
a hostile named-data entry (range edited, hash re-encoded) is refused with a typed error naming the key."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from edgetorch.backends.onnxruntime import OrtPartitioner, _blob
from edgetorch.errors import FormatError, ProgramFormatError
from edgetorch.exir import to_edge
from edgetorch.exir.backend import lowered_module_of
from edgetorch.exir.config import EdgeCompileConfig
from edgetorch.formats import program as pf
from edgetorch.runtime import Runtime
from tests.backends.onnxruntime._util import delegate_calls

DIM = 192  # a 192x192 float weight is 147 KiB: above named_data_min_bytes (64 KiB)


class TwoWay(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _program(model: nn.Module, specs: dict | None = None):
    methods = {"prefill": torch.export.export(model, (torch.randn(8, DIM),)),
               "decode": torch.export.export(model, (torch.randn(1, DIM),))}
    edge = to_edge(methods, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    return edge.to_backend(OrtPartitioner(compile_specs=specs) if specs else OrtPartitioner()).to_executorch()


@pytest.fixture(scope="module")
def shared():
    torch.manual_seed(0)
    model = TwoWay().eval()
    return model, _program(model), _program(model, {"named_data_min_bytes": b"-1"})


def test_two_methods_store_each_weight_once(shared):
    model, prog, inline = shared
    defn = pf.decode_flatbuffer(prog.buffer[pf.HEADER_SIZE:])
    big = [p for p in model.state_dict().values() if p.nbytes >= 65536]
    assert len(defn.named_data) == len(big) == 2
    assert sorted(size for _, _, size in defn.named_data) == sorted(p.nbytes for p in big)
    keys = {hashlib.sha256(p.numpy().tobytes()).hexdigest() for p in big}
    assert {k.removeprefix(_blob.NAMED_KEY_PREFIX) for k, _, _ in defn.named_data} == keys
    unique = sum(p.nbytes for p in big)
    # the inline program holds each big weight twice (once per method's blob), the shared one once
    assert inline.size - prog.size >= unique - 2 * 4096
    assert prog.size < unique * 1.2 + 64 * 1024
    for name in ("prefill", "decode"):
        ep = prog.exported_program(name)
        for call in delegate_calls(ep):
            blob = lowered_module_of(call, ep.graph_module).processed_bytes
            assert len(blob) < 64 * 1024  # weights are not in the blob
            with pytest.raises(_blob.OrtBlobError, match="named data"):
                _blob.unpack(blob)


@pytest.mark.parametrize("method,rows", [("prefill", 8), ("decode", 1)])
def test_outputs_equal_eager_and_the_inline_program(shared, method, rows):
    model, prog, inline = shared
    x = torch.randn(rows, DIM)
    want = model(x)
    got = Runtime.get().load_program(prog.buffer).load_method(method).execute([x])[0]
    ref = Runtime.get().load_program(inline.buffer).load_method(method).execute([x])[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got, ref)


def _reencode(buf: bytes, edit) -> bytes:
    header = pf.read_header(buf)
    defn = pf.decode_flatbuffer(buf[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size])
    edit(defn)
    seg = memoryview(buf)[header.segment_offset:header.segment_offset + header.segment_size]
    return b"".join(bytes(p) for p in pf.build_file_parts(defn, [seg]))


@pytest.mark.parametrize("verification", ["Minimal", "InternalConsistency"])
@pytest.mark.parametrize("edit", ["outside", "misaligned", "size"])
def test_a_hostile_named_data_entry_is_refused(shared, edit, verification):
    from edgetorch.runtime.program import Verification

    _, prog, _ = shared

    def change(defn):
        key, off, size = defn.named_data[0]
        new = {"outside": (key, off + (1 << 40), size), "misaligned": (key, off + 8, size),
               "size": (key, off, size - 4)}[edit]
        defn.named_data[0] = new

    bad = _reencode(prog.buffer, change)
    key = pf.decode_flatbuffer(bad[pf.HEADER_SIZE:]).named_data[0][0]
    with pytest.raises(FormatError) as info:
        p = Runtime.get().load_program(bad, verification=getattr(Verification, verification))
        for m in ("prefill", "decode"):
            p.load_method(m).execute([torch.randn(8 if m == "prefill" else 1, DIM)])
    assert key in str(info.value) or "named_data[0]" in str(info.value)


def test_a_key_the_program_lacks_is_named(shared):
    _, prog, _ = shared

    def drop(defn):
        defn.named_data.pop(0)

    bad = _reencode(prog.buffer, drop)
    with pytest.raises(ProgramFormatError, match="no named data 'onnxruntime/sha256:"):
        Runtime.get().load_program(bad).load_method("decode")


def test_a_mapped_program_releases_the_copied_weights_and_still_runs(shared, tmp_path):
    model, prog, _ = shared
    path = tmp_path / "shared.pte"
    path.write_bytes(prog.buffer)
    loaded = Runtime.get().load_program(str(path))
    for method, rows in (("prefill", 8), ("decode", 1)):
        x = torch.randn(rows, DIM)
        torch.testing.assert_close(loaded.load_method(method).execute([x])[0], model(x), rtol=1e-4, atol=1e-4)


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(512, 64), nn.Linear(64, DIM)  # 128 KiB table: named data

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(tokens))


def test_a_table_only_gather_reads_is_bound_in_place_not_copied(tmp_path):
    """ORT would copy an embedding table into each method's session; it is bound to the program's bytes."""
    from edgetorch.backends.onnxruntime.runtime import set_runtime_options

    torch.manual_seed(0)
    model = Embed().eval()
    methods = {"prefill": torch.export.export(model, (torch.randint(0, 512, (1, 8)),)),
               "decode": torch.export.export(model, (torch.randint(0, 512, (1, 1)),))}
    prog = to_edge(methods, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_backend(
        OrtPartitioner()).to_executorch()
    path = tmp_path / "embed.pte"
    path.write_bytes(prog.buffer)
    key = _blob.NAMED_KEY_PREFIX + hashlib.sha256(model.emb.weight.detach().numpy().tobytes()).hexdigest()
    assert key in {k for k, _, _ in pf.decode_flatbuffer(prog.buffer[pf.HEADER_SIZE:]).named_data}
    got = {}
    for ops in ("Gather", ""):
        set_runtime_options(in_place_ops=ops)
        try:
            loaded = Runtime.get().load_program(str(path))
            for method, rows in (("prefill", 8), ("decode", 1)):
                m = loaded.load_method(method)
                (handle,) = m._delegate_handles.values()
                bound = [e["name"] for e in handle.header["initializers"] if e.get("key") == key]
                assert handle._bound == (bound if ops else [])
                assert len(bound) == 1 and (bound[0] in [i.name for i in handle.session.get_inputs()]) == bool(ops)
                tokens = torch.randint(0, 512, (1, rows))
                got[ops, method] = m.execute([tokens])[0]
                torch.testing.assert_close(got[ops, method], model(tokens), rtol=1e-4, atol=1e-4)
                got[ops, method, "feeds"] = torch.empty_like(got[ops, method])
                handle.run_without_binding([tokens], [got[ops, method, "feeds"]])
                torch.testing.assert_close(got[ops, method, "feeds"], model(tokens), rtol=1e-4, atol=1e-4)
        finally:
            set_runtime_options(in_place_ops=None)


def test_methods_lowering_the_same_graph_share_one_session(shared, tmp_path):
    """Two methods exported from one dynamic graph store its blob once and run it on one ORT session (one copy
    of the packed weights); methods with different graphs keep their own sessions."""
    model, static, _ = shared
    ep = torch.export.export(model, (torch.randn(8, DIM),),
                             dynamic_shapes=({0: torch.export.Dim("rows", min=1, max=16)},))
    prog = to_edge({"prefill": ep, "decode": ep}, compile_config=EdgeCompileConfig(_check_ir_validity=False)
                   ).to_backend(OrtPartitioner()).to_executorch()
    assert len(pf.decode_flatbuffer(prog.buffer[pf.HEADER_SIZE:]).delegate_data) == 1
    path = tmp_path / "one_graph.pte"
    path.write_bytes(prog.buffer)
    sessions = []
    for buffer, same in ((str(path), True), (prog.buffer, True), (static.buffer, False)):
        loaded = Runtime.get().load_program(buffer)
        pre, dec = loaded.load_method("prefill"), loaded.load_method("decode")
        (hp,), (hd,) = pre._delegate_handles.values(), dec._delegate_handles.values()
        assert hp is not hd and (hp.session is hd.session) == same
        sessions.append(hd.session)
        for _ in range(2):  # alternating methods on the shared session
            for m, rows in ((pre, 8), (dec, 1)):
                x = torch.randn(rows, DIM)
                torch.testing.assert_close(m.execute([x])[0], model(x), rtol=1e-4, atol=1e-4)
    other = Runtime.get().load_program(str(path)).load_method("decode")
    assert next(iter(other._delegate_handles.values())).session is not sessions[0]  # one cache per program



def test_one_graph_method_inputs_give_decode_the_prefills_graph():
    """``one_graph=True`` (what ``generate --recipe onnxruntime_*`` exports): decode gets the prefill's example
    inputs and dynamic shapes, so both methods export, lower and store the same delegates (test above)."""
    from edgetorch.models import hf

    inputs, shapes = hf.hf_method_inputs(256, 8, one_graph=True), hf.hf_dynamic_shapes(64, one_graph=True)
    assert inputs["decode"] is inputs["prefill"] and shapes["decode"] is shapes["prefill"]
    assert shapes["prefill"]["input_ids"][1].min == 1  # a one-token decode fits the prefill's range
    static = hf.hf_method_inputs(256, 8)
    assert static["decode"][0].shape == (1, 1) and hf.hf_dynamic_shapes(64)["decode"] is None
