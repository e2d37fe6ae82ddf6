"""Quiet by default, typed errors for a user's mistakes: the HTML report module loads neither torchao nor the
compiler; the third-party messages a user cannot act on are filtered (``--verbose`` / ``EDGETORCH_VERBOSE=1`` /
``edgetorch._quiet.set_quiet(False)`` show them) and nothing else is; an ETDump or ETRecord path that is a
directory and an input missing an argument are ``edgetorch.errors`` errors naming what was expected."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch

from edgetorch import _quiet
from edgetorch.devtools import Inspector
from edgetorch.errors import ArtifactIOError, EdgeTorchError, InspectorError
from edgetorch.exir import to_edge_transform_and_lower
from edgetorch.runtime import Runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), **env))


def test_the_report_module_loads_neither_torchao_nor_the_compiler():
    # nor torch itself: the report draws tables and graphs already extracted (torch is imported where a graph
    # module is read), so `import edgetorch.devtools.report` costs ~0.6 s of CPU, not 2 s (issue 24)
    heavy = ("torch", "torchao", "edgetorch.exir.program", "edgetorch.export")
    r = _python(f"import sys, edgetorch.devtools.report\nprint(sorted(m for m in {heavy!r} if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() not in self.messages:  # a child logger's record reaches its parent's handler too
            self.messages.append(record.getMessage())


@pytest.fixture
def collected():
    h = _Collect()
    loggers = [logging.getLogger(n) for n in _quiet.NOISE]
    for lg in loggers:
        lg.addHandler(h)
    yield h
    for lg in loggers:
        lg.removeHandler(h)
    _quiet.install_default()


def test_listed_third_party_messages_are_dropped_and_shown_when_verbose(collected):
    noise = [("torchao", "Failed to load /venv/torchao/_C_mxfp8.so: Could not load this library"),
             ("torchao.kernel.intmm", "Warning: Detected no triton, on systems without Triton certain kernels"),
             ("torch.utils._pytree", "<enum 'K'> is an Enum subclass ... Calling register_constant() on Enum "
                                     "subclasses is deprecated and will be an error"),
             ("torch.onnx._internal.exporter._registration", "torchvision is not installed. Skipping x::nms")]
    other = ("torchao", "a message torchao means for the user")
    _quiet.set_quiet(True)
    for name, msg in [*noise, other]:
        logging.getLogger(name).warning(msg)
    assert collected.messages == [other[1]]  # only the listed messages are dropped
    _quiet.set_quiet(False)
    for name, msg in noise:
        logging.getLogger(name).warning(msg)
    assert collected.messages[1:] == [m for _, m in noise]


def test_the_leafspec_future_warning_is_dropped_unless_verbose():
    msg = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead."
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.resetwarnings()  # no filter but edgetorch's (pytest's configuration ignores this one too)
            _quiet.set_quiet(True)
            warnings.warn(msg, FutureWarning, stacklevel=1)
            assert got == []
            _quiet.set_quiet(False)
            warnings.warn(msg + " ", FutureWarning, stacklevel=1)  # another text: not in the once-registry
            assert [str(w.message) for w in got] == [msg + " "]
    finally:
        _quiet.install_default()


def test_importing_torchao_through_edgetorch_prints_none_of_the_listed_messages():
    r = _python("import edgetorch, torchao.quantization.pt2e, edgetorch.devtools.inspector.float_reference")
    assert r.returncode == 0, r.stderr
    for text in ("Failed to load", "Detected no triton", "register_constant()", "LeafSpec"):
        assert text not in r.stderr, r.stderr


def test_directories_are_typed_errors(tmp_path):
    with pytest.raises(ArtifactIOError, match="ETDump file .* is a directory"):
        Inspector(etdump_path=tmp_path)


class TwoInputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * scale


def test_an_input_missing_an_argument_is_a_typed_error(tmp_path):
    x, scale = torch.randn(2, 3), torch.tensor(2.0)
    et = to_edge_transform_and_lower(torch.export.export(TwoInputs(), (x, scale)),
                                     generate_etrecord=True).to_executorch()
    et.get_etrecord().save(tmp_path / "r.bin")
    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(x, scale)
    prog.write_etdump_result_to_file(tmp_path / "e.etdp", tmp_path / "e.bin")
    with pytest.raises(ArtifactIOError, match="ETRecord file .* is a directory"):
        Inspector(etdump_path=tmp_path / "e.etdp", etrecord=tmp_path, debug_buffer_path=tmp_path / "e.bin")
    insp = Inspector(etdump_path=tmp_path / "e.etdp", etrecord=tmp_path / "r.bin", debug_buffer_path=tmp_path / "e.bin")
    with pytest.raises(InspectorError, match=r"takes 2 inputs \(x, scale\), the input given has 1") as e:
        insp.calculate_numeric_gap("MSE", inputs=(x,))
    assert isinstance(e.value, EdgeTorchError)
    assert insp.find_culprits(insp.calculate_numeric_gap("MSE", inputs=(x, scale))).empty
