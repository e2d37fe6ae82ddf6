"""ETDump tools: read an .etdp file (``read_etdump``) and the debug buffer its tensors live in
(``DebugBuffer``, zero-copy and bounds-checked). The format itself is ``edgetorch.formats.etdump``."""

from edgetorch.devtools.etdump.debug_buffer import DebugBuffer, read_etdump
from edgetorch.formats.etdump import (
    DebugEvent,
    ETDump,
    Event,
    ProfileEvent,
    RunData,
    Tensor,
    Value,
    ValueType,
    deserialize_etdump,
    serialize_etdump,
)

__all__ = [
    "DebugBuffer",
    "DebugEvent",
    "ETDump",
    "Event",
    "ProfileEvent",
    "RunData",
    "Tensor",
    "Value",
    "ValueType",
    "deserialize_etdump",
    "read_etdump",
    "serialize_etdump",
]
