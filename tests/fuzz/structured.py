"""The structure-aware mutation campaign (issue 23), shared by ``tests/fuzz/test_structured_campaign.py`` (a few
hundred mutants per kind) and ``bench/fuzz_structured.py`` (10,000 and more).

Kinds (``KINDS``): ``mlp``, ``cnn`` (small_cnn, portable), ``cnn_ort`` (small_cnn lowered to ONNX Runtime) and
``llama`` (llama_tiny with its KV cache) ``.pte`` files; the mlp's ``etrecord``, ``etdump`` and ``debug_buffer``.
Mutant ``i`` of a kind under seed ``s`` is a pure function of ``(kind, s, i)``: the artifact decoded with the
project's reader, ONE field edited semantically (``structured_mutators``), re-encoded with a valid hash /
manifest / CRC.

Oracles (in a worker process that loads the artifacts and inputs once and runs a batch of mutants):

* a ``.pte`` is loaded under ``Verification.InternalConsistency`` (every tenth mutant also under ``Full`` and
  ``Minimal``) with its arena pre-filled with ``0xFF`` bytes (NaN in every float dtype) and run (llama: two calls,
  the second reads the cache the first wrote). Outputs equal to the original's: ``same``. Otherwise it is run again
  with the arena pre-filled with ``0x55``: outputs that differ between the two runs read memory no instruction
  wrote (``uninit-read``). After each run the arena bytes outside every planned slot must still hold the fill
  (``write-outside-slot``) and the file's bytes (the constants the runtime views in place) must be unchanged
  (``constant-written``);
* an ETRecord / ETDump / debug buffer goes through ``Inspector`` + ``calculate_numeric_gap("MSE")`` +
  ``find_culprits``; the gap and culprit tables are compared with the original's.

Classes: ``typed`` (an edgetorch error), ``same``, ``valid:<category>`` (ran with other outputs, and the edit made
another valid program or recording: see ``VALID``), ``changed:<category>`` (ran with other outputs for a reason
that is not a valid edit: a failure), ``generic`` (any other exception), ``crash`` / ``hang`` (found by the
driver), ``uninit-read``, ``write-outside-slot``, ``constant-written``, ``unencodable`` (the writer refused the
edit: not a mutant).
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PTE_KINDS = ("mlp", "cnn", "cnn_ort", "llama")
GAP_KINDS = ("etrecord", "etdump", "debug_buffer")
KINDS = PTE_KINDS + GAP_KINDS
MODELS = {"mlp": "mlp", "cnn": "small_cnn", "cnn_ort": "small_cnn", "llama": "llama_tiny"}
FAILURES = {"generic", "crash", "hang", "uninit-read", "write-outside-slot", "constant-written"}
# Verification.Minimal checks neither bounds nor the plan (docs/formats.md): only a crash or a hang fails there
MINIMAL_FAILURES = {"crash", "hang"}
# categories of edits whose silent output change is another valid program (or recording): the runtime ran, with
# every check passing and deterministically, what the edited file says
VALID = {
    "arg-same-type": "an argument moved to another tensor of the same shape and dtype",
    "arg": "an argument moved to another value the op accepts",
    "output": "an instruction writes another planned tensor the plan allows",
    "op": "an operator swapped for another allowed one that accepts the arguments",
    "op-index": "an instruction calls another operator of the table that accepts its arguments",
    "scalar": "a scalar argument (int, float, bool, list item, dtype) changed",
    "io": "the method returns or reads another defined value",
    "spec": "the input/output tree spec changed",
    "constants": "a constant reads other bytes of the constant segment",
    "order": "two instructions swapped (the def-use re-proof still holds)",
    "tensor-constant": "a constant tensor viewed with another shape, stride or offset inside its bytes",
    "debug-values": "logged values of a debug buffer changed (another recording; only a signature could tell)",
    "ref-op": "a reference-graph node calls another allowed op that accepts its arguments (another valid model)",
    "ref-node": "a reference-graph node reads another node that fits (another valid model)",
    "delegate-spec": "a delegate's compile spec changed (another valid delegate configuration)",
}


def build_artifacts(folder: str) -> dict[str, str]:
    """The seven originals in ``folder`` (built once; later calls reuse them): kind -> path."""
    from tests.fuzz import fuzzlib

    base = fuzzlib.build_artifacts(folder)
    paths = {"mlp": base["pte"], "cnn_ort": base["pte_ort"], "etrecord": base["etrecord"], "etdump": base["etdp"],
             "debug_buffer": base["debug_buffer"], "cnn": os.path.join(folder, "cnn.pte"),
             "llama": os.path.join(folder, "llama_tiny.pte")}
    for kind in ("cnn", "llama"):
        if not os.path.exists(paths[kind]):
            import torch

            from edgetorch.exir import to_edge
            from edgetorch.models import get_model

            model, inputs = get_model(MODELS[kind])
            to_edge(torch.export.export(model, inputs)).to_executorch().save(paths[kind])
    return paths


# ---------------------------------------------------------------------------------------------------------
# mutants
# ---------------------------------------------------------------------------------------------------------

@dataclass
class Context:
    """What a worker loads once: the originals, inputs, and the original outputs / tables."""

    paths: dict[str, str]
    tmp: str
    kind: str
    original: bytes = b""
    inputs: tuple = ()
    baseline: object = None
    etrecord: object = None
    etdump: bytes = b""
    buffer: bytes = b""
    decoded: bytes = b""


def make_mutant(ctx: Context, seed: int, i: int) -> tuple[object, str]:
    """Mutant ``i``: the edited artifact (bytes; a pair for the debug buffer) and what was edited."""
    from tests.fuzz import structured_mutators as sm

    rng = random.Random(f"{ctx.kind}:{seed}:{i}")
    for _ in range(6):
        try:
            return _make(ctx, rng, sm)
        except Exception as e:  # noqa: BLE001 - the writer refused the edit: try another one
            last = f"{type(e).__name__}: {e}"[:200]
    return None, f"unencodable: {last}"


def _make(ctx: Context, rng: random.Random, sm) -> tuple[object, str]:
    from edgetorch.formats import etdump as ed

    if ctx.kind in PTE_KINDS:
        import pickle

        from tests.fuzz.pte_edit import decode, encode

        if not ctx.decoded:  # the decoded original, copied per mutant (pickle of our own objects: 3x faster)
            ctx.decoded = pickle.dumps(decode(ctx.original))
        prog, seg = pickle.loads(ctx.decoded)
        what = sm.mutate_pte(prog, rng)
        return encode(prog, seg), what
    if ctx.kind == "etdump":
        doc = ed.deserialize_etdump(ctx.etdump)
        what = sm.mutate_etdump(doc, rng)
        return ed.serialize_etdump(doc), what
    if ctx.kind == "debug_buffer":
        doc = ed.deserialize_etdump(ctx.etdump)
        buf, what = sm.mutate_debug_buffer(doc, ctx.buffer, rng)
        return (ed.serialize_etdump(doc), buf), what
    from tests.fuzz.fuzzlib import reseal_etrecord

    with zipfile.ZipFile(io.BytesIO(ctx.original)) as z:
        infos = z.infolist()
        entries = {x.filename: z.read(x) for x in infos}
    what = sm.mutate_etrecord(entries, rng)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for x in infos:
            z.writestr(x, entries[x.filename])
    return reseal_etrecord(out.getvalue()), what


# ---------------------------------------------------------------------------------------------------------
# oracles
# ---------------------------------------------------------------------------------------------------------

_FILL = [0xFF]


def _install_arena_fill() -> None:
    """Every method arena of this process starts filled with ``_FILL[0]`` (the worker's hook, not the runtime's:
    the runtime zero-fills nothing it plans to write first)."""
    from edgetorch.runtime import method as m

    if getattr(m._allocate_arena, "_fuzz", False):
        return
    orig = m._allocate_arena

    def filled(plan):
        t = orig(plan)
        t[:_planned_end(plan)].fill_(_FILL[0])  # not the pages of an edited huge arena_size no slot reaches
        return t
    filled._fuzz = True
    m._allocate_arena = filled


def _planned_end(plan) -> int:
    """The end of the last planned slot: the arena bytes the oracle fills and checks."""
    from edgetorch.formats import program as pf

    return max([v.arena_offset + v.nbytes for v in plan.values if isinstance(v, pf.TensorDef)
                and v.placement == pf.PLACEMENT_PLANNED and v.arena_offset >= 0] + [0])


def _slot_mask(method) -> object:
    import numpy as np

    from edgetorch.formats import program as pf

    plan = method._plan
    mask = np.zeros(min(int(method._arena.numel()), _planned_end(plan)), dtype=bool)
    for v in plan.values:
        if isinstance(v, pf.TensorDef) and v.placement == pf.PLACEMENT_PLANNED and v.nbytes > 0 and v.arena_offset >= 0:
            mask[v.arena_offset:v.arena_offset + v.nbytes] = True
    return mask


def _run_pte(ctx: Context, data: bytes, level: str, fill: int) -> tuple[list, str | None]:
    """Outputs of the method's calls, and a memory-safety finding (or None)."""
    import numpy as np
    import torch

    from edgetorch.runtime import Runtime, Verification

    _FILL[0] = fill
    crc = zlib.crc32(data)
    prog = Runtime.get().load_program(data, verification=getattr(Verification, level))
    method = prog.load_method("forward")
    outs = []
    for _ in range(2 if ctx.kind == "llama" else 1):
        outs.append([o.clone() if isinstance(o, torch.Tensor) else o for o in method.execute(*ctx.inputs)])
    mask = _slot_mask(method)
    arena = method._arena[:mask.size].numpy()
    if arena.size and not np.all(arena[~mask] == fill):
        return outs, "write-outside-slot"
    if zlib.crc32(data) != crc:
        return outs, "constant-written"
    return outs, None


def _same(a: object, b: object) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)) \
            if a.dtype.itemsize == 1 or a.numel() == 0 else torch.equal(
                a.contiguous().flatten().view(torch.uint8), b.contiguous().flatten().view(torch.uint8))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def _attempt(fn) -> tuple[str, object]:
    from edgetorch.errors import EdgeTorchError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", fn()
    except EdgeTorchError as e:
        return "typed", f"{type(e).__name__}: {str(e)[:240]}"
    except Exception as e:  # noqa: BLE001 - a generic exception is a finding
        return "generic", f"{type(e).__name__}: {str(e)[:240]}"


def _category(what: str) -> str:
    return what.split(":", 1)[0]


def _changed(what: str) -> str:
    cat = _category(what)
    return f"valid:{cat}" if cat in VALID else f"changed:{cat}"


def check_pte(ctx: Context, data: bytes, what: str, level: str) -> tuple[str, str]:
    status, r = _attempt(lambda: _run_pte(ctx, data, level, 0xFF))
    if status != "ok":
        return status, str(r)
    outs, finding = r
    if finding:
        return finding, ""
    if _same(outs, ctx.baseline):
        return "same", ""
    status, r2 = _attempt(lambda: _run_pte(ctx, data, level, 0x55))
    if status != "ok":
        return "uninit-read", f"second run with another arena fill: {r2}"
    if r2[1]:
        return r2[1], ""
    if not _same(r2[0], outs):
        return "uninit-read", "outputs depend on the arena's initial bytes"
    return _changed(what), ""


def _tables(etdump: bytes, etrecord: object, buffer_path: str) -> str:
    from edgetorch.devtools import Inspector
    from tests.fuzz.fuzzlib import gap_key

    insp = Inspector(etdump_data=etdump, etrecord=etrecord, debug_buffer_path=buffer_path)
    df = insp.calculate_numeric_gap("MSE")
    return gap_key(df) + "\n--\n" + gap_key(insp.find_culprits(df))


def check_gaps(ctx: Context, mutant: object, what: str) -> tuple[str, str]:
    p = ctx.paths
    if ctx.kind == "etrecord":
        path = os.path.join(ctx.tmp, "m_etrecord.bin")
        with open(path, "wb") as f:
            f.write(mutant)
        fn = lambda: _tables(ctx.etdump, path, p["debug_buffer"])  # noqa: E731
    elif ctx.kind == "etdump":
        fn = lambda: _tables(mutant, ctx.etrecord, p["debug_buffer"])  # noqa: E731
    else:
        etdp, buf = mutant
        path = os.path.join(ctx.tmp, "m_debug.bin")
        with open(path, "wb") as f:
            f.write(buf)
        fn = lambda: _tables(etdp, ctx.etrecord, path)  # noqa: E731
    status, r = _attempt(fn)
    if status != "ok":
        return status, str(r)
    return ("same", "") if r == ctx.baseline else (_changed(what), "")


def make_context(paths: dict[str, str], kind: str) -> Context:
    from edgetorch.devtools.etrecord import parse_etrecord
    from edgetorch.models import get_model

    ctx = Context(paths, tempfile.mkdtemp(prefix="edgetorch-sfuzz-"), kind)
    with open(paths[kind], "rb") as f:
        ctx.original = f.read()
    if kind in PTE_KINDS:
        _install_arena_fill()
        ctx.inputs = get_model(MODELS[kind])[1]
        from tests.fuzz.pte_edit import decode, encode

        ctx.original = encode(*decode(ctx.original))  # what an unedited round trip writes
        ctx.baseline, finding = _run_pte(ctx, ctx.original, "Full", 0xFF)
        assert finding is None, f"the original {kind} program fails the oracle: {finding}"
        return ctx
    with open(paths["etdump"], "rb") as f:
        ctx.etdump = f.read()
    with open(paths["debug_buffer"], "rb") as f:
        ctx.buffer = f.read()
    ctx.etrecord = parse_etrecord(paths["etrecord"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx.baseline = _tables(ctx.etdump, ctx.etrecord, paths["debug_buffer"])
    return ctx


def check_mutant(ctx: Context, seed: int, i: int) -> dict:
    """The verdicts of mutant ``i``: ``outcome`` (InternalConsistency, or the Inspector for the other kinds),
    and for every tenth program ``full`` and ``minimal``."""
    mutant, what = make_mutant(ctx, seed, i)
    rec: dict = {"i": i, "mutation": what}
    if mutant is None:
        rec["outcome"] = "unencodable"
        return rec
    if ctx.kind in PTE_KINDS:
        rec["outcome"], rec["detail"] = check_pte(ctx, mutant, what, "InternalConsistency")
        if i % 10 == 0:
            rec["full"] = check_pte(ctx, mutant, what, "Full")[0]
            rec["minimal"] = check_pte(ctx, mutant, what, "Minimal")[0]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec["outcome"], rec["detail"] = check_gaps(ctx, mutant, what)
    return rec


# ---------------------------------------------------------------------------------------------------------
# worker and driver
# ---------------------------------------------------------------------------------------------------------

def worker(folder: str, kind: str, seed: int, start: int, stop: int, out_path: str) -> None:
    """Mutants ``[start, stop)``, one JSON line each after a ``{"begin": i}`` line (so that the driver can name the
    mutant a crash or hang happened on)."""
    import logging

    logging.disable(logging.CRITICAL)
    import shutil

    ctx = make_context(build_artifacts(folder), kind)
    try:
        with open(out_path, "a", buffering=1) as out:
            for i in range(start, stop):
                out.write(json.dumps({"begin": i}) + "\n")
                out.flush()
                out.write(json.dumps(check_mutant(ctx, seed, i)) + "\n")
    finally:
        shutil.rmtree(ctx.tmp, ignore_errors=True)


@dataclass
class Report:
    kind: str
    results: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self, level: str = "outcome") -> Counter:
        return Counter(r[level] for r in self.results if level in r)

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.results if _is_failure(r.get("outcome", "")) or _is_failure(r.get("full", ""))
                or r.get("minimal") in MINIMAL_FAILURES]


def _is_failure(outcome: str) -> bool:
    return outcome in FAILURES or outcome.startswith("changed:")


def run_batch(folder: str, kind: str, seed: int, start: int, stop: int, per_mutant_timeout: float = 20.0,
              nice: int = 0) -> Report:
    """Mutants ``[start, stop)`` in worker subprocesses; a worker that dies or hangs is restarted after the mutant
    it was on, which is classified ``crash`` or ``hang``."""
    from tests.fuzz.fuzzlib import _read_results

    report, i, t0 = Report(kind), start, time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edgetorch-sfuzz-") as tmp:
        while i < stop:
            out_path = os.path.join(tmp, f"{kind}-{i}.jsonl")
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + ROOT,
                       EDGETORCH_NO_FAST_EXIT="1", OMP_NUM_THREADS="1")
            cmd = [sys.executable, "-m", "tests.fuzz.structured", folder, kind, str(seed), str(i), str(stop), out_path]
            if nice:
                cmd = ["nice", "-n", str(nice), *cmd]
            err_path = out_path + ".err"
            with open(err_path, "w") as err_file:
                proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err_file)
                rc = _watch(proc, out_path, per_mutant_timeout)
            with open(err_path, errors="replace") as f:
                err = f.read()[-3000:]
            done, begun = _read_results(out_path)
            report.results += done
            if rc == 0 and begun is None:
                break
            if begun is None:
                raise RuntimeError(f"structured fuzz worker for {kind} failed (rc={rc}):\n{err[-3000:]}")
            report.results.append({"i": begun, "mutation": _mutation_of(folder, kind, seed, begun),
                                   "outcome": "hang" if rc is None else "crash", "detail": f"rc={rc} {err[-400:]}"})
            i = begun + 1
    report.seconds = time.monotonic() - t0
    return report


def _watch(proc: subprocess.Popen, out_path: str, per_mutant: float) -> int | None:
    """Waits for the worker; kills it when one mutant runs longer than ``per_mutant`` seconds (after a start-up
    allowance of two minutes). Returns its exit status, None for a hang."""
    last, size = time.monotonic() + 120.0, -1
    while proc.poll() is None:
        time.sleep(0.5)
        now_size = os.path.getsize(out_path) if os.path.exists(out_path) else 0
        if now_size != size:
            size, last = now_size, max(last, time.monotonic())
        elif time.monotonic() - last > per_mutant:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def _mutation_of(folder: str, kind: str, seed: int, i: int) -> str:
    ctx = Context(build_artifacts(folder), "", kind)
    with open(ctx.paths[kind], "rb") as f:
        ctx.original = f.read()
    if kind in ("etdump", "debug_buffer"):
        ctx.etdump = open(ctx.paths["etdump"], "rb").read()
        ctx.buffer = open(ctx.paths["debug_buffer"], "rb").read()
    return make_mutant(ctx, seed, i)[1]


if __name__ == "__main__":
    a = sys.argv[1:]
    worker(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5])
