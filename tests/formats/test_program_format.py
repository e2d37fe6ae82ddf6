"""The .pte writer and reader agree: every value type and instruction kind round-trips."""

from __future__ import annotations

from edgetorch.formats import program as pf

LEAF_SPEC = '[1, {"type": null, "context": null, "children_spec": []}]'


def test_round_trip_of_every_value_kind():
    values = [None, True, 3, 2.5, "hi", pf.IntListV((1, 2)), pf.DoubleListV((0.5,)), pf.BoolListV((True, False)),
              pf.TensorDef(6, [2, 3], [3, 1], 0, pf.PLACEMENT_PLANNED, 24, 0, -1),
              pf.TensorDef(15, [4], [1], 0, pf.PLACEMENT_CONSTANT, 8, -1, 0),
              pf.TensorListV((8, 9)), pf.OptionalTensorListV((8, -1)), pf.DtypeV(5), pf.LayoutV(0),
              pf.MemoryFormatV(2), pf.DeviceV("cpu")]
    plan = pf.PlanDef(
        name="forward", values=values, inputs=[8], outputs=[8], input_spec=LEAF_SPEC, output_spec=LEAF_SPEC,
        input_names=["x"], output_names=["y"], operators=[pf.OperatorDef("aten::add", "out")],
        delegates=[pf.BackendDelegateDef("onnxruntime", 0, [("level", b"\x01")])],
        instructions=[pf.InstructionDef(pf.KernelCallDef(0, pf.CALL_OUT, [8, 8, 3], [8]), "add", 7, "m.py:3"),
                      pf.InstructionDef(pf.DelegateCallDef(0, [8], [8]), "lowered", 8, "")],
        arena_size=64, debug_buffer_bytes=64)
    prog = pf.ProgramDef([plan], constants=[(0, 8)], delegate_data=[(64, 3)])
    parts = pf.build_file_parts(prog, [b"\1" * 8 + b"\0" * 56 + b"abc"])
    data = b"".join(bytes(p) for p in parts)
    header = pf.read_header(data)
    back = pf.decode_flatbuffer(data[header.flatbuffer_offset:header.flatbuffer_offset + header.flatbuffer_size])
    assert back == prog
    pf.check_consistency(back, header.segment_size)
    assert header.content_hash == parts[0][pf.HEADER.size - 32:pf.HEADER.size].hex()
