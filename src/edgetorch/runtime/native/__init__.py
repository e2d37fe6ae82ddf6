"""Native kernels of the portable backend, built on first use with the machine's C compiler and called via ctypes.

``q4.c`` holds the int4 kernels of ``edgetorch::linear_q4`` (``edgetorch.runtime.lowbit``): a matrix-vector
product straight from the packed bytes (decode: no unpacked copy of any weight, ever) and a one-pass dequantization
to bfloat16 for the prefill's GEMM. The source ships with the package; :func:`kernels` compiles it once per
machine and source (``-O3 -march=native -fopenmp``, keyed by the source, the flags, the compiler and the CPU's
feature flags) into the user's cache directory, atomically (temporary file + rename), and loads it. The OpenMP
runtime it links is torch's (the same ``libgomp.so.1``, already loaded), so it shares torch's thread pool.

Nothing here comes from a program file: a program can only select these kernels by calling ``linear_q4``, whose
arguments ``lowbit`` checks before any pointer reaches C. Without a compiler (or with ``EDGETORCH_NATIVE=0``)
:func:`kernels` returns ``None`` and ``lowbit`` uses its torch-only kernels; :func:`status` says which and why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = ["NativeKernels", "cache_dir", "kernels", "status"]

_SOURCE = Path(__file__).with_name("q4.c")
_FLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11")
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


class NativeKernels:
    """The loaded library's functions, with their C signatures."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        self.path = path
        self.dequant_bf16 = lib.q4_dequant_bf16
        self.dequant_bf16.argtypes = [ptr, ptr, i64, i64, i64, ptr, c_int]
        self.dequant_bf16.restype = None
        self.gemv_f32 = lib.q4_gemv_f32
        self.gemv_f32.argtypes = [ptr, i64, ptr, ptr, i64, i64, i64, ptr, c_int]
        self.gemv_f32.restype = None
        self.quantize_rows = lib.q8_quantize_rows
        self.quantize_rows.argtypes = [ptr, i64, i64, ptr, ptr, ptr]
        self.quantize_rows.restype = c_int
        self.quantize_rows_bf16 = lib.q8_quantize_rows_bf16
        self.quantize_rows_bf16.argtypes = [ptr, i64, i64, ptr, ptr, c_int]
        self.quantize_rows_bf16.restype = c_int
        self.q8q4_gemv = lib.q8q4_gemv
        self.q8q4_gemv.argtypes = [ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, ptr, c_int]
        self.q8q4_gemv.restype = None
        self.q8q4_linear = lib.q8q4_linear
        self.q8q4_linear.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, ptr, c_int]
        self.q8q4_linear.restype = c_int
        self.has_avx512 = bool(lib.q4_has_avx512())
        self.has_vnni = bool(lib.q8_has_vnni())


def cache_dir() -> Path:
    """Where built kernels live: ``$EDGETORCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgetorch``, else
    ``~/.cache/edgetorch`` (a ``native`` folder inside, private to the user)."""
    root = os.environ.get("EDGETORCH_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edgetorch")
    return Path(root) / "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def _compiler() -> str | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return cc if cc and shutil.which(cc) else None


def _private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) and refuse one that another user owns or others can write."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is not private to this user")


def _build(cc: str, arch: str = "native") -> Path:
    """The library for ``-march=arch`` (tests also build a generic one: the code path of CPUs without AVX-512)."""
    source = _SOURCE.read_bytes()
    flags = (*_FLAGS, f"-march={arch}")
    version = subprocess.run([cc, "--version"], capture_output=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), version, _cpu_flags().encode(),
                                     platform.machine().encode()])).hexdigest()[:20]
    folder = cache_dir()
    _private_dir(folder)
    target = folder / f"q4-{key}.so"
    if target.exists():
        st = target.stat()
        if st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return target
        raise PermissionError(f"{target} is not private to this user")
    fd, tmp = tempfile.mkstemp(prefix=".q4-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(_SOURCE), "-lm", "-o", tmp], capture_output=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.decode(errors="replace").strip()[-2000:] or "compiler failed")
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def kernels() -> NativeKernels | None:
    """The native kernels, built and loaded on first call; ``None`` when they cannot be (see :func:`status`)."""
    if "kernels" in _STATE:
        return _STATE["kernels"]  # type: ignore[return-value]
    with _LOCK:
        if "kernels" not in _STATE:
            _STATE["kernels"], _STATE["status"] = _load()
    return _STATE["kernels"]  # type: ignore[return-value]


def _load() -> tuple[NativeKernels | None, str]:
    if os.environ.get("EDGETORCH_NATIVE", "1") == "0":
        return None, "disabled by EDGETORCH_NATIVE=0"
    if platform.system() != "Linux":
        return None, f"not built on {platform.system()} (Linux only)"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC)"
    import torch  # noqa: F401  (its libgomp.so.1 must be loaded first: the kernels then share torch's pool)

    try:
        path = _build(cc)
        lib = NativeKernels(ctypes.CDLL(str(path)), path)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return None, f"build failed: {e}"
    return lib, f"loaded {path} ({_isa(lib)})"


def _isa(lib: NativeKernels) -> str:
    return "AVX-512 VNNI" if lib.has_vnni else "AVX-512" if lib.has_avx512 else "generic C"


def status() -> str:
    """Whether the native kernels are in use, and why not when they are not."""
    kernels()
    return str(_STATE["status"])
