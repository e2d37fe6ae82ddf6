"""ETRecord: the ahead-of-time debug record that links runtime instruction ids back to graph nodes.

``ETRecord`` holds the ATen and edge programs of every method (with debug handles, stack traces and module
stacks), the handle groups (``formats.handles.HandleGroup``: what each instruction and each op inside a delegate
covers), the .pte content hash, and optional representative inputs / reference outputs. Files are a zip of JSON
and raw tensor bytes (see docs/formats.md, "ETRecord"); reading one never unpickles anything. Parsing is lazy:
programs are deserialized on first access, while ``reference_graph(method)`` and ``handle_table(method)`` load
from compact entries in milliseconds, with weights mapped from the file. Containers of types other than the
plain ones (a Hugging Face ``ModelOutput``, a dataclass, a namedtuple) are stored by name and read back as
``ForeignContainer`` tuples, so a record loads in a process that never imports the library that defined them.
"""

from edgetorch.devtools.etrecord._archive import FORMAT_VERSION, MARKER
from edgetorch.devtools.etrecord._etrecord import ETRecord, generate_etrecord, parse_etrecord
from edgetorch.devtools.etrecord._reference import NodeInfo
from edgetorch.devtools.etrecord._tensors import ForeignContainer
from edgetorch.errors import ETRecordError, ETRecordFormatError

__all__ = [
    "ETRecord",
    "ETRecordError",
    "ETRecordFormatError",
    "FORMAT_VERSION",
    "ForeignContainer",
    "MARKER",
    "NodeInfo",
    "generate_etrecord",
    "parse_etrecord",
]
