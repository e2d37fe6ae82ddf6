"""User errors at the command line (issue 9): one ``error: ...`` line and exit status 2, never a traceback,
checked before long work starts; exit 3 only for a bug, and its message says so."""

from __future__ import annotations

import argparse
import errno
import os

import pytest

from edgetorch.cli import _common
from tests.cli.conftest import cli


def _user_error(r, match: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    assert r.stderr.startswith("error: ") and match in r.stderr, r.stderr[-2000:]


def test_demo_refuses_an_unknown_model_before_any_work(tmp_path):
    r = cli("demo", "--model", "no_such_model", "--out", str(tmp_path / "o"))
    _user_error(r, "unknown --model 'no_such_model'")
    assert not (tmp_path / "o").exists()


def test_demo_refuses_an_unknown_distance_before_any_work(tmp_path):
    r = cli("demo", "--model", "mlp", "--distance", "nope", "--out", str(tmp_path / "o"))
    _user_error(r, "--distance must be one of")
    assert not (tmp_path / "o").exists()


def test_demo_refuses_an_out_folder_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    _user_error(cli("demo", "--model", "mlp", "--out", str(f)), "is not a directory")


def test_run_refuses_a_corrupted_bundled_program(artifacts, tmp_path):
    data = bytearray(open(artifacts.bpte, "rb").read())
    data[len(data) // 2] ^= 0xFF  # inside the embedded program's weights or the test cases
    bad = tmp_path / "bad.bpte"
    bad.write_bytes(bytes(data))
    r = cli("run", "--bundled_program_path", str(bad), "--output_verification")
    _user_error(r, str(bad))


def test_run_refuses_a_truncated_bundled_program(artifacts, tmp_path):
    bad = tmp_path / "short.bpte"
    bad.write_bytes(open(artifacts.bpte, "rb").read()[:5000])
    _user_error(cli("run", "--bundled_program_path", str(bad)), "short.bpte")


def test_inspect_refuses_a_debug_buffer_of_another_recording(artifacts, tmp_path):
    paths = {}
    for k in ("a", "b"):
        paths[k] = (str(tmp_path / f"{k}.etdp"), str(tmp_path / f"{k}.bin"))
        r = cli("run", "--bundled_program_path", artifacts.bpte, "--dump_intermediate_outputs",
                "--etdump_path", paths[k][0], "--debug_output_path", paths[k][1])
        assert r.returncode == 0, r.stderr[-2000:]
    ok = cli("inspect", "--etdump", paths["a"][0], "--etrecord", artifacts.etrecord, "--debug-buffer", paths["a"][1],
             "--gap", "MSE")
    assert ok.returncode == 0, ok.stderr[-2000:]
    r = cli("inspect", "--etdump", paths["a"][0], "--etrecord", artifacts.etrecord, "--debug-buffer", paths["b"][1],
            "--gap", "MSE")
    _user_error(r, "written by recording")
    r = cli("inspect", "--etdump", paths["a"][0], "--etrecord", artifacts.etrecord, "--debug-buffer",
            artifacts.etrecord, "--gap", "MSE")  # the ETRecord zip given as the debug buffer
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_dump_outputs_writes_a_sealed_buffer(artifacts, tmp_path):
    from edgetorch.devtools.etdump import DebugBuffer, read_etdump

    etdp, buf = str(tmp_path / "o.etdp"), str(tmp_path / "o.bin")
    r = cli("run", "--bundled_program_path", artifacts.bpte, "--dump_outputs", "--etdump_path", etdp,
            "--debug_output_path", buf)
    assert r.returncode == 0, r.stderr[-2000:]
    d = read_etdump(etdp)
    b = DebugBuffer(buf)
    b.check(d)  # trailer, run id and CRC agree
    assert b.trailer.run_id == d.run_id and d.debug_buffer_crc32 == b.trailer.crc32


def _guarded(fn) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = _common.guarded(fn, argparse.Namespace(verbose=False))
    return code, err.getvalue()


def _raise(e: BaseException):
    def fn(args):
        raise e
    return fn


def test_a_full_disk_is_a_user_error_naming_the_path():
    code, err = _guarded(_raise(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/out/etdump.etdp")))
    assert code == 2 and "/data/out/etdump.etdp" in err and "No space left" in err


def test_a_typed_format_error_is_a_user_error():
    from edgetorch.errors import ProgramFormatError

    code, err = _guarded(_raise(ProgramFormatError("bad header", field="header", path="/x/m.pte")))
    assert code == 2 and "/x/m.pte" in err


@pytest.mark.parametrize("exc", [TypeError("boom"), KeyError("k"), IndexError("list index out of range")])
def test_anything_else_is_reported_as_a_bug_with_exit_3(exc):
    code, err = _guarded(_raise(exc))
    assert code == 3 and "bug in edgetorch" in err and "-v" in err and "Traceback" not in err
