"""Bundled programs (.bpte): a program packaged with test inputs and expected outputs per method.

    bp = BundledProgram(et_program_manager, [MethodTestSuite("forward", [MethodTestCase(inputs, model(*inputs))])])
    bp.save("model.bpte")                       # or serialize_from_bundled_program_to_flatbuffer(bp) -> bytes
    Runtime.get().load_program("model.bpte")    # runs the embedded program like a .pte
    edgetorch run --bundled_program_path model.bpte --output_verification
"""

from edgetorch.devtools.bundled_program.config import (
    ConfigValue,
    MethodInputType,
    MethodOutputType,
    MethodTestCase,
    MethodTestSuite,
)
from edgetorch.devtools.bundled_program.core import BundledProgram
from edgetorch.devtools.bundled_program.errors import (
    BundledInputMismatchError,
    BundledMethodNotFoundError,
    BundledOutputMismatchError,
    BundledProgramError,
    BundledProgramFormatError,
    InvalidTestCaseError,
)
from edgetorch.devtools.bundled_program.serialize import (
    deserialize_from_flatbuffer_to_bundled_program,
    load_bundled_program,
    serialize_from_bundled_program_to_flatbuffer,
)

__all__ = [
    "BundledInputMismatchError",
    "BundledMethodNotFoundError",
    "BundledOutputMismatchError",
    "BundledProgram",
    "BundledProgramError",
    "BundledProgramFormatError",
    "ConfigValue",
    "InvalidTestCaseError",
    "MethodInputType",
    "MethodOutputType",
    "MethodTestCase",
    "MethodTestSuite",
    "deserialize_from_flatbuffer_to_bundled_program",
    "load_bundled_program",
    "serialize_from_bundled_program_to_flatbuffer",
]
