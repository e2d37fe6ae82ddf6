"""``edgetorch run`` user errors of issue 23: a debug buffer too small or too large and an ETDump path that cannot
be created each exit 2 with one ``error: ...`` line, before running, and write nothing."""

from __future__ import annotations

import os

from tests.cli.conftest import cli


def _user_error(r, match: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], r.stderr[-2000:]
    assert "Model executed" not in r.stdout


def _run(artifacts, tmp_path, *extra: str):
    return cli("run", "--model_path", artifacts.pte, "--dump_intermediate_outputs",
               "--etdump_path", str(tmp_path / "r.etdp"), "--debug_output_path", str(tmp_path / "r.bin"), *extra)


def test_a_debug_buffer_too_small_for_the_runs_is_a_user_error(artifacts, tmp_path):
    r = _run(artifacts, tmp_path, "--debug_buffer_size", "64", "--num_executions", "2")
    _user_error(r, "--debug_buffer_size 64 is too small: 2 execution(s) of method 'forward' store")
    assert not os.path.exists(tmp_path / "r.etdp") and not os.path.exists(tmp_path / "r.bin")


def test_a_debug_buffer_above_one_tib_is_refused_by_the_parser(artifacts, tmp_path):
    r = _run(artifacts, tmp_path, "--debug_buffer_size", "2048G")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --debug_buffer_size: at most 1099511627776 bytes" in r.stderr


def test_a_debug_buffer_that_cannot_be_reserved_is_a_user_error(artifacts, tmp_path):
    _user_error(_run(artifacts, tmp_path, "--debug_buffer_size", "900G"), "cannot be reserved")


def test_an_etdump_path_where_no_file_can_be_created_is_a_user_error(artifacts, tmp_path):
    r = cli("run", "--model_path", artifacts.pte, "--etdump_path", "/proc/x.etdp")
    _user_error(r, "cannot write --etdump_path /proc/x.etdp")
