"""A seeded mutation fuzzer for every artifact edgetorch reads (shared by ``tests/fuzz`` and
``bench/fuzz_artifacts.py``).

Artifacts (``build_artifacts``): a portable ``.pte`` (mlp), a ``.pte`` with an ONNX Runtime delegate (small_cnn),
the ETDump and debug buffer of a debug run of the mlp, its ETRecord and a bundled program (``.bpte``).
Mutant ``i`` of kind ``k`` under seed ``s`` is a pure function of ``(k, s, i)`` (``mutate``): bit flips,
overwrites, truncation, appended bytes, zeroed ranges, swapped chunks, edited flatbuffer offsets, edited
ETRecord JSON entries. Each mutant is loaded with the public API (``check_mutant``) and classified:

* ``same``: accepted, same outputs / gap table as the original;
* ``typed``: refused with an edgetorch error (``edgetorch.errors.EdgeTorchError``; for ``edgetorch run``:
  exit status 1 or 2);
* ``generic``: any other exception, or ``edgetorch run`` exit 3 (a bug);
* ``changed``: accepted with different outputs or gaps. For a ``.pte`` under ``Verification.Full``, an ETRecord
  or a debug buffer, this is a failure (silent corruption); for a ``.pte`` under InternalConsistency it is
  expected when only weights changed (``ic-changed-weights``) or an edit made another valid program
  (``ic-changed-program``: an argument index pointing at another tensor of a fitting shape), and a failure when a
  kernel computed a shape other than the planned one (``ic-shape-disagreement``);
  for an ETDump (no checksum) it is reported but allowed;
* ``crash`` / ``hang``: the worker process died or ran past its timeout on that mutant (found by the driver).

Workers run batches of mutants in a subprocess (``run_batch``) so that a crash or hang is caught and attributed
to one mutant; the driver restarts after it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KINDS = ("pte", "pte_ort", "etdp", "debug_buffer", "etrecord", "bpte")
FAILURES = {"generic", "crash", "hang", "full-changed", "ic-shape-disagreement", "changed-gaps", "run-exit-3"}
FILES = {"pte": "mlp.pte", "pte_ort": "cnn_ort.pte", "etdp": "mlp.etdp", "debug_buffer": "mlp_debug.bin",
         "etrecord": "mlp_etrecord.bin", "bpte": "mlp.bpte"}


# ---------------------------------------------------------------------------------------------------------
# artifacts
# ---------------------------------------------------------------------------------------------------------

def build_artifacts(folder: str) -> dict[str, str]:
    """Writes the six artifacts into ``folder`` (once; a later call reuses them); returns kind -> path."""
    paths = {k: os.path.join(folder, f) for k, f in FILES.items()}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    import torch

    from edgetorch.backends.onnxruntime import OrtPartitioner
    from edgetorch.devtools.bundled_program import BundledProgram, MethodTestCase, MethodTestSuite
    from edgetorch.exir import to_edge_transform_and_lower
    from edgetorch.models import get_model
    from edgetorch.runtime import Runtime

    model, inputs = get_model("mlp")
    et = to_edge_transform_and_lower(torch.export.export(model, inputs), generate_etrecord=True).to_executorch()
    et.save(paths["pte"])
    with torch.no_grad():
        expected = model(*inputs)
    bp = BundledProgram(et, [MethodTestSuite("forward", [MethodTestCase(inputs, expected)])])
    bp.save(paths["bpte"])
    rec = et.get_etrecord()
    rec.update_representative_inputs(inputs)
    rec.save(paths["etrecord"])
    prog = Runtime.get().load_program(paths["pte"], enable_etdump=True, debug_buffer_size="auto")
    prog.load_method("forward").execute(*inputs)
    prog.write_etdump_result_to_file(paths["etdp"], paths["debug_buffer"])
    cnn, cnn_inputs = get_model("small_cnn")
    ort = to_edge_transform_and_lower(torch.export.export(cnn, cnn_inputs), partitioner=[OrtPartitioner()])
    ort.to_executorch().save(paths["pte_ort"])
    return paths


# ---------------------------------------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------------------------------------

_INTERESTING = (0, 1, 2, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 4096, 65535, 65536,
                0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE)


def _pos(rng: random.Random, n: int, lo: int = 0) -> int:
    return rng.randrange(lo, n) if n > lo else 0


def _bitflip(rng, data: bytearray, lo: int) -> str:
    for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
        p = _pos(rng, len(data), lo)
        data[p] ^= 1 << rng.randrange(8)
    return "bitflip"


def _overwrite(rng, data: bytearray, lo: int) -> str:
    p = _pos(rng, len(data), lo)
    if rng.random() < 0.5 and p + 4 <= len(data):
        data[p:p + 4] = struct.pack("<I", rng.choice(_INTERESTING))
        return "overwrite-u32"
    n = rng.randint(1, 16)
    data[p:p + n] = bytes(rng.randrange(256) for _ in range(min(n, len(data) - p)))
    return "overwrite"


def _truncate(rng, data: bytearray, lo: int) -> str:
    del data[_pos(rng, len(data)):]
    return "truncate"


def _append(rng, data: bytearray, lo: int) -> str:
    data += bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 64, 200))))
    return "append"


def _zero(rng, data: bytearray, lo: int) -> str:
    p = _pos(rng, len(data), lo)
    n = rng.choice((4, 16, 64, 256, 4096))
    data[p:p + n] = bytes(min(n, len(data) - p))
    return "zero"


def _swap(rng, data: bytearray, lo: int) -> str:
    n = rng.choice((4, 8, 16, 64))
    if len(data) < lo + 2 * n:
        return _bitflip(rng, data, lo)
    a, b = _pos(rng, len(data) - n, lo), _pos(rng, len(data) - n, lo)
    ca, cb = bytes(data[a:a + n]), bytes(data[b:b + n])
    data[a:a + n], data[b:b + n] = cb, ca
    return "swap"


def _fb_offset(rng, data: bytearray, lo: int, region: tuple[int, int]) -> str:
    """Edits a 32-bit word of the flatbuffer that looks like an offset (a small value, 4-aligned)."""
    start, end = region
    cands = [p for p in range(start, end - 3, 4) if 0 < struct.unpack_from("<I", data, p)[0] < end - start]
    if not cands:
        return _bitflip(rng, data, lo)
    p = rng.choice(cands)
    v = struct.unpack_from("<I", data, p)[0]
    v = rng.choice((v + 4, v - 4, v + rng.randint(1, 64), v * 2, 0, 0xFFFFFFFF, v ^ (1 << rng.randrange(32))))
    struct.pack_into("<I", data, p, v & 0xFFFFFFFF)
    return "fb-offset"


def _edit_json_value(rng, doc):
    """A copy of ``doc`` with one leaf changed, a key dropped or a list shortened."""
    paths = []

    def walk(x, path):
        paths.append(path)
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + (k,))
        elif isinstance(x, list):
            for i, v in enumerate(x[:50]):
                walk(v, path + (i,))
    walk(doc, ())
    path = rng.choice(paths)
    if not path:
        return rng.choice((None, 0, [], {}, "x"))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key, old = path[-1], parent[path[-1]]
    op = rng.random()
    if op < 0.15 and isinstance(parent, dict):
        del parent[key]
    elif isinstance(old, bool):
        parent[key] = not old
    elif isinstance(old, int):
        parent[key] = rng.choice((old + 1, old - 1, -1, 0, old * 2 + 3, 1 << 40, str(old), None))
    elif isinstance(old, float):
        parent[key] = rng.choice((old * 2, -old, 0.0, old + 1e-3))
    elif isinstance(old, str):
        parent[key] = rng.choice((old + "x", "", old[:-1], "forward", 1, None))
    elif isinstance(old, list):
        parent[key] = rng.choice((old[:-1], old + old[:1], [], None, 3))
    else:
        parent[key] = rng.choice((None, 0, "x", [], {}))
    return doc


def _edit_etrecord_json(rng, data: bytearray) -> tuple[bytearray, str]:
    """Rewrites the ETRecord zip with one JSON entry edited (valid zip, valid CRCs)."""
    try:
        zin = zipfile.ZipFile(io.BytesIO(bytes(data)))
        infos = zin.infolist()
        names = [i.filename for i in infos if i.filename.endswith(".json") or i.filename.startswith("ETRECORD")]
        target = rng.choice(names)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as zout:
            for info in infos:
                body = zin.read(info)
                if info.filename == target:
                    body = json.dumps(_edit_json_value(rng, json.loads(body))).encode()
                zout.writestr(info, body)
        return bytearray(out.getvalue()), f"json-edit:{target}"
    except Exception:
        return data, "json-edit-failed"


_BYTE_MUTATORS = (_bitflip, _bitflip, _overwrite, _truncate, _append, _zero, _swap)


def _fb_region(kind: str, data: bytes) -> tuple[int, int] | None:
    if kind in ("pte", "pte_ort") and len(data) >= 40:
        fb_off, fb_size = struct.unpack_from("<QQ", data, 16)
        return fb_off, min(fb_off + fb_size, len(data))
    if kind == "etdp":
        return 4, len(data)
    if kind == "bpte" and len(data) >= 64:
        return 0, min(len(data), 4096)
    return None


def mutate(kind: str, original: bytes, seed: int, index: int) -> tuple[bytes, str]:
    """Mutant ``index`` of ``original`` (deterministic in ``kind``, ``seed`` and ``index``) and its mutation."""
    rng = random.Random(f"{kind}:{seed}:{index}")
    data = bytearray(original)
    region = _fb_region(kind, original)
    r = rng.random()
    if kind == "etrecord" and r < 0.3:
        data, what = _edit_etrecord_json(rng, data)
        return bytes(data), what
    if region is not None and r < 0.3:
        what = _fb_offset(rng, data, 0, region)
        return bytes(data), what
    # bias towards the structured part of a file: the header and flatbuffer are small next to the weights
    lo = 0
    if region is not None and rng.random() < 0.6:
        end = region[1]
        view = bytearray(data[:end])
        what = rng.choice(_BYTE_MUTATORS)(rng, view, 0)
        if what in ("truncate", "append"):
            data = view if what == "truncate" else view + data[end:]
        else:
            data[:end] = view[:end] if len(view) >= end else view
        return bytes(data), what + "@structure"
    what = rng.choice(_BYTE_MUTATORS)(rng, data, lo)
    return bytes(data), what


# ---------------------------------------------------------------------------------------------------------
# oracles (run inside a worker process)
# ---------------------------------------------------------------------------------------------------------

@dataclass
class Context:
    """What a worker loads once: the artifacts, the inputs and the original outputs / gap tables."""

    paths: dict[str, str]
    tmp: str
    originals: dict[str, bytes] = field(default_factory=dict)
    inputs: dict[str, tuple] = field(default_factory=dict)
    baseline: dict[str, object] = field(default_factory=dict)
    etrecord: object = None


def gap_key(df) -> str:
    """A comparable text form of a gap table (timing columns left out)."""
    cols = [c for c in df.columns if "time" not in str(c).lower()]
    return df[cols].to_csv(index=False)


def _gaps(etdump: bytes | str, etrecord, debug_buffer: str) -> str:
    from edgetorch.devtools import Inspector

    kw = {"etdump_data": etdump} if isinstance(etdump, bytes) else {"etdump_path": etdump}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        insp = Inspector(etrecord=etrecord, debug_buffer_path=debug_buffer, **kw)
        return gap_key(insp.calculate_numeric_gap("MSE"))


def make_context(paths: dict[str, str], kinds: list[str]) -> Context:
    from edgetorch.devtools.etrecord import parse_etrecord
    from edgetorch.models import get_model

    ctx = Context(paths, tempfile.mkdtemp(prefix="edgetorch-fuzz-"))
    for k in kinds:
        with open(paths[k], "rb") as f:
            ctx.originals[k] = f.read()
    ctx.inputs["pte"] = ctx.inputs["bpte"] = get_model("mlp")[1]
    ctx.inputs["pte_ort"] = get_model("small_cnn")[1]
    for k in ("pte", "pte_ort"):
        if k in kinds:
            ctx.baseline[k] = _run_pte(ctx.originals[k], ctx.inputs[k], full=True)
    if {"etdp", "debug_buffer", "etrecord"} & set(kinds):
        ctx.etrecord = parse_etrecord(paths["etrecord"])
        ctx.baseline["gaps"] = _gaps(paths["etdp"], paths["etrecord"], paths["debug_buffer"])
    return ctx


def _run_pte(data: bytes, inputs: tuple, full: bool) -> list:
    from edgetorch.runtime import Runtime, Verification

    v = Verification.Full if full else Verification.InternalConsistency
    prog = Runtime.get().load_program(data, verification=v)
    return prog.load_method("forward").execute(*inputs)


def _same(a: list, b: list) -> bool:
    import torch

    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.nan_to_num(), y.nan_to_num()):
                return False
        elif x != y:
            return False
    return True


def _outcome_of(fn) -> tuple[str, object]:
    from edgetorch.errors import EdgeTorchError

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = fn()
        resized = any("resized" in str(w.message) for w in caught)
        return ("resized" if resized else "ok"), r
    except EdgeTorchError as e:
        return "typed", f"{type(e).__name__}: {str(e)[:300]}"
    except Exception as e:  # noqa: BLE001 - a generic exception is what the fuzzer looks for
        return "generic", f"{type(e).__name__}: {str(e)[:300]}"


def _verdict(status: str, r: object, base: list, data: bytes, orig: bytes, full: bool) -> tuple[str, str]:
    if status in ("typed", "generic"):
        return status, str(r)
    if _same(r, base) and status == "ok":
        return "same", ""
    if full:
        return "full-changed", status
    fb_end = sum(struct.unpack_from("<QQ", orig, 16))
    # hash bytes [48, 80) and the header padding are not read under InternalConsistency
    if data[:48] == orig[:48] and data[80:fb_end] == orig[80:fb_end]:
        return "ic-changed-weights", status  # Full catches these; InternalConsistency does not read the weights
    if status == "resized":
        return "ic-shape-disagreement", status  # a kernel computed a shape other than the planned one
    return "ic-changed-program", status  # another valid program (an edited index or stride): Full catches these


def _check_pte(ctx: Context, kind: str, data: bytes) -> tuple[str, str, str]:
    """(verdict under Verification.Full, detail, verdict under InternalConsistency)."""
    base, inputs, orig = ctx.baseline[kind], ctx.inputs[kind], ctx.originals[kind]
    status, r = _outcome_of(lambda: _run_pte(data, inputs, full=True))
    full, detail = _verdict(status, r, base, data, orig, True)
    status, r = _outcome_of(lambda: _run_pte(data, inputs, full=False))
    ic, detail2 = _verdict(status, r, base, data, orig, False)
    return full, f"full: {detail} | ic: {detail2}", ic


def _check_gaps(ctx: Context, kind: str, data: bytes) -> tuple[str, str]:
    path = os.path.join(ctx.tmp, FILES[kind])
    with open(path, "wb") as f:
        f.write(data)
    p = ctx.paths
    if kind == "etdp":
        fn = lambda: _gaps(data, ctx.etrecord, p["debug_buffer"])  # noqa: E731
    elif kind == "debug_buffer":
        fn = lambda: _gaps(p["etdp"], ctx.etrecord, path)  # noqa: E731
    else:
        fn = lambda: _gaps(p["etdp"], path, p["debug_buffer"])  # noqa: E731
    status, r = _outcome_of(fn)
    if status in ("typed", "generic"):
        return status, str(r)
    if r == ctx.baseline["gaps"]:
        return "same", ""
    return ("etdp-changed" if kind == "etdp" else "changed-gaps"), ""


def _check_bpte(ctx: Context, data: bytes) -> tuple[str, str]:
    from edgetorch.cli.main import main

    path = os.path.join(ctx.tmp, "m.bpte")
    with open(path, "wb") as f:
        f.write(data)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["run", "--bundled_program_path", path, "--output_verification"])
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 2
    except Exception as e:  # noqa: BLE001
        return "generic", f"{type(e).__name__}: {e}"[:300]
    tail = err.getvalue().strip().splitlines()[-1:] or [""]
    if code == 0:
        return "same", ""
    if code in (1, 2):
        return "typed", f"exit {code}: {tail[0][:300]}"
    return "run-exit-3", f"exit {code}: {tail[0][:300]}"


def check_mutant(ctx: Context, kind: str, data: bytes) -> dict:
    """``{"outcome", "detail"}`` of one mutant of ``kind`` (a program also gets ``"ic"``: its verdict under
    InternalConsistency, ``"outcome"`` being the one under Full)."""
    if kind in ("pte", "pte_ort"):
        full, detail, ic = _check_pte(ctx, kind, data)
        return {"outcome": full, "ic": ic, "detail": detail}
    outcome, detail = _check_bpte(ctx, data) if kind == "bpte" else _check_gaps(ctx, kind, data)
    return {"outcome": outcome, "detail": detail}


# ---------------------------------------------------------------------------------------------------------
# worker and driver
# ---------------------------------------------------------------------------------------------------------

def worker(folder: str, kind: str, seed: int, start: int, stop: int, out_path: str) -> None:
    """Runs mutants ``[start, stop)`` of ``kind``, appending one JSON line per mutant to ``out_path`` (a
    ``{"begin": i}`` line first, so that the driver can name the mutant that crashed or hung)."""
    os.environ["EDGETORCH_NO_FAST_EXIT"] = "1"
    import logging

    logging.disable(logging.CRITICAL)
    paths = build_artifacts(folder)
    ctx = make_context(paths, [kind])
    crash_at = int(os.environ.get("EDGETORCH_FUZZ_CRASH_AT", "-1"))  # tests of the driver only
    with open(out_path, "a", buffering=1) as out:
        for i in range(start, stop):
            data, what = mutate(kind, ctx.originals[kind], seed, i)
            out.write(json.dumps({"begin": i}) + "\n")
            out.flush()
            if i == crash_at:
                os.abort()
            out.write(json.dumps({"i": i, "mutation": what, **check_mutant(ctx, kind, data)}) + "\n")


@dataclass
class Report:
    kind: str
    results: list[dict] = field(default_factory=list)

    @property
    def counts(self) -> Counter:
        return Counter(r["outcome"] for r in self.results)

    @property
    def ic_counts(self) -> Counter:
        """Verdicts under InternalConsistency (programs only)."""
        return Counter(r["ic"] for r in self.results if "ic" in r)

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.results if r["outcome"] in FAILURES or r.get("ic") in FAILURES]


def _read_results(path: str) -> tuple[list[dict], int | None]:
    done, begun = [], None
    if not os.path.exists(path):
        return done, None
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "begin" in rec:
                begun = rec["begin"]
            else:
                done.append(rec)
                begun = None
    return done, begun


def run_batch(folder: str, kind: str, seed: int, start: int, stop: int, timeout: float = 120.0,
              per_mutant_timeout: float = 30.0) -> Report:
    """Runs mutants ``[start, stop)`` in worker subprocesses; a worker that crashes or hangs is restarted
    after the mutant it was on, which is classified ``crash`` or ``hang``."""
    report = Report(kind)
    i = start
    with tempfile.TemporaryDirectory(prefix="edgetorch-fuzz-") as tmp:
        while i < stop:
            out_path = os.path.join(tmp, f"{kind}-{i}.jsonl")
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + ROOT,
                       EDGETORCH_NO_FAST_EXIT="1", OMP_NUM_THREADS="1")
            cmd = [sys.executable, "-m", "tests.fuzz.fuzzlib", folder, kind, str(seed), str(i), str(stop), out_path]
            budget = timeout + per_mutant_timeout * (stop - i) / 10
            t0 = time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget)
                rc, err = proc.returncode, proc.stderr
            except subprocess.TimeoutExpired as e:
                rc, err = None, (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else ""
            done, begun = _read_results(out_path)
            report.results += done
            if rc == 0 and begun is None:
                break
            if begun is None:  # died before the first mutant (e.g. failed to build the context)
                raise RuntimeError(f"fuzz worker for {kind} failed (rc={rc}) after {time.monotonic() - t0:.0f} s:"
                                   f"\n{err[-3000:]}")
            report.results.append({"i": begun, "mutation": mutate(kind, _original(folder, kind), seed, begun)[1],
                                   "outcome": "hang" if rc is None else "crash",
                                   "detail": f"rc={rc} {err[-500:]}"})
            i = begun + 1
    return report


def _original(folder: str, kind: str) -> bytes:
    with open(os.path.join(folder, FILES[kind]), "rb") as f:
        return f.read()


if __name__ == "__main__":
    a = sys.argv[1:]
    worker(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5])


def edit_etrecord_json(data: bytes, entry: str, edit: Callable[[dict], None]) -> bytes:
    """The ETRecord zip ``data`` with the JSON entry ``entry`` changed in place by ``edit(doc)`` and the manifest
    resealed: a hostile edit that only the deeper checks can refuse."""
    zin = zipfile.ZipFile(io.BytesIO(data))
    doc = json.loads(zin.read(entry))
    edit(doc)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, json.dumps(doc).encode() if info.filename == entry else zin.read(info))
    return reseal_etrecord(buf.getvalue())


def reseal_etrecord(data: bytes) -> bytes:
    """The ETRecord zip ``data`` with its ``manifest.json`` recomputed from the entries it now holds (what a
    test that edits entries on purpose needs to reach the deeper checks; a corrupted file has a stale one)."""
    import hashlib
    import zlib

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        sums = {}
        for info in src.infolist():
            if info.filename == "manifest.json":
                continue
            body = src.read(info)
            dst.writestr(info, body)
            sums[info.filename] = f"crc32:{zlib.crc32(body):08x}" if info.filename.endswith(".bin") \
                else "sha256:" + hashlib.sha256(body).hexdigest()
        dst.writestr("manifest.json", json.dumps({"version": 1, "entries": sums}))
    return out.getvalue()
