"""Loading a saved ExportedProgram (``torch.export.save`` .pt2 archive) without unpickling untrusted data.

``torch.export.load`` in torch 2.13 CAN run pickle on file contents:
  * weights and constants whose payload config says ``use_pickle`` (tensor subclasses) go through
    ``torch.load(..., weights_only=False)``;
  * custom-object constants go through ``torch._C._pickle_load_obj`` and opaque objects through ``pickle.loads``;
  * the sample inputs blob goes through ``torch.load(weights_only=True)`` but falls back to
    ``weights_only=False`` when that fails;
  * archives of the pre-2.8 layout take a legacy path with the same fallback;
  * AOTInductor entries make it load compiled shared libraries.
``load_exported_program`` therefore reads the archive into memory, checks every entry first and raises
``UnsafeModelFileError`` (naming the entry) for any of the cases above, and only then hands the checked bytes to
``torch.export.load``. Nothing is refused silently: if you trust the file, load it yourself with
``torch.export.load(path)`` and pass the ExportedProgram to ``export()``.
"""

from __future__ import annotations

import io
import json
import os
import zipfile

import torch
from torch.export import ExportedProgram

from edgetorch.errors import ExportInputError, UnsafeModelFileError

__all__ = ["load_exported_program"]

_TRUST_HINT = ("If you trust this file, load it with torch.export.load(path) yourself and pass the "
               "ExportedProgram to edgetorch.export.export().")


def _unsafe(path: str, entry: str, why: str) -> UnsafeModelFileError:
    return UnsafeModelFileError(f"{path}: refusing to load: {entry} {why}, which torch.export.load would "
                                f"unpickle (unpickling can run arbitrary code). {_TRUST_HINT}")


def _config(z: zipfile.ZipFile, name: str, path: str) -> dict:
    try:
        cfg = json.loads(z.read(name))["config"]
    except (KeyError, ValueError) as e:
        raise ExportInputError(f"{path}: malformed payload config {name}: {e}") from None
    if not isinstance(cfg, dict):
        raise ExportInputError(f"{path}: malformed payload config {name}")
    return cfg


def check_archive(data: bytes, path: str) -> None:
    """Raises unless ``data`` is a current-format .pt2 archive with no pickled payloads."""
    from torch.export.pt2_archive import constants as c

    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise ExportInputError(f"{path}: not a saved ExportedProgram (torch.export.save writes a zip archive)") \
            from None
    names = z.namelist()
    roots = {n.split("/", 1)[0] for n in names if "/" in n}
    if "version" in names:
        raise _unsafe(path, "the archive", "uses the legacy (pre torch 2.8) layout, whose loader falls back to "
                      "torch.load(weights_only=False)")
    if len(roots) != 1:
        raise ExportInputError(f"{path}: not a torch.export.save archive (expected one top-level folder, found "
                               f"{sorted(roots)})")
    root = roots.pop() + "/"
    rel = {n[len(root):] for n in names if n.startswith(root)}
    if c.ARCHIVE_VERSION_PATH not in rel:
        raise ExportInputError(f"{path}: no {c.ARCHIVE_VERSION_PATH} entry: not a torch.export.save archive")
    for n in rel:
        if n.startswith(c.AOTINDUCTOR_DIR):
            raise _unsafe(path, n, "is an AOTInductor artifact (compiled code)")
    models = sorted(n[len(c.MODELS_DIR):-len(".json")] for n in rel
                    if n.startswith(c.MODELS_DIR) and n.endswith(".json"))
    if "model" not in models:
        raise ExportInputError(f"{path}: the archive holds no 'model' program (found {models})")
    for m in models:
        weights_legacy = f"{c.WEIGHTS_DIR}{m}.pt"
        constants_legacy = f"{c.CONSTANTS_DIR}{m}.pt"
        for legacy in (weights_legacy, constants_legacy):
            if legacy in rel:
                raise _unsafe(path, legacy, "is a legacy pickled payload")
        for fmt in (c.WEIGHTS_CONFIG_FILENAME_FORMAT, c.CONSTANTS_CONFIG_FILENAME_FORMAT):
            cfg_name = fmt.format(m)
            if cfg_name not in rel:
                raise ExportInputError(f"{path}: missing {cfg_name}")
            for fqn, meta in _config(z, root + cfg_name, path).items():
                pname = str(meta.get("path_name", ""))
                if meta.get("use_pickle", False):
                    raise _unsafe(path, f"{fqn} ({pname})", "is a pickled tensor payload")
                if pname.startswith((c.CUSTOM_OBJ_FILENAME_PREFIX, c.OPAQUE_OBJ_FILENAME_PREFIX)):
                    raise _unsafe(path, f"{fqn} ({pname})", "is a pickled custom object")
        sample = c.SAMPLE_INPUTS_FILENAME_FORMAT.format(m)
        if sample in rel:
            blob = z.read(root + sample)
            if blob:
                try:  # the restricted unpickler: tensors and containers only
                    torch.load(io.BytesIO(blob), weights_only=True)
                except Exception as e:
                    raise _unsafe(path, sample, f"cannot be read with torch.load(weights_only=True) ({e})") \
                        from None


def load_exported_program(path: str | os.PathLike) -> ExportedProgram:
    """Loads ``path`` (written by ``torch.export.save``) after checking it holds nothing that would be unpickled
    (see the module docstring). Raises ``ExportInputError`` for a missing or malformed file and
    ``UnsafeModelFileError`` for a file with pickled payloads."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ExportInputError(f"cannot read saved ExportedProgram {path!r}: {e.strerror or e}") from None
    check_archive(data, path)
    try:
        ep = torch.export.load(io.BytesIO(data))  # the bytes checked above, not the file again
    except Exception as e:
        raise ExportInputError(f"{path}: torch.export.load failed: {type(e).__name__}: {e}") from e
    if not isinstance(ep, ExportedProgram):
        raise ExportInputError(f"{path}: loaded a {type(ep).__name__}, not an ExportedProgram")
    return ep
