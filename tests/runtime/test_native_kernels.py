"""The native int4 kernels (``edgetorch.runtime.native``): each one against an independent computation (torch's
own dequantization and activation quantization, float64 matrix products), the fallback when they cannot be built,
the private build cache, and the argument checks that stand between a program's tensors and C pointers."""

from __future__ import annotations

import ctypes
import os
import stat

import pytest
import torch

from edgetorch.runtime import lowbit, native

KERNELS = native.kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason=f"native kernels unavailable: {native.status()}")


@pytest.fixture(scope="module", params=["native", "generic"])
def built(request, tmp_path_factory):
    """The kernels built for this CPU, and built for a generic x86-64 (the C path of CPUs without AVX-512)."""
    if request.param == "native":
        return KERNELS
    if native.platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the generic build is x86-64")
    os.environ["EDGETORCH_CACHE_DIR"] = str(tmp_path_factory.mktemp("generic"))
    try:
        path = native._build(native._compiler(), arch="x86-64-v2")
    finally:
        del os.environ["EDGETORCH_CACHE_DIR"]
    lib = native.NativeKernels(ctypes.CDLL(str(path)), path)
    assert not lib.has_avx512 and not lib.has_vnni
    return lib


def _weights(n: int, k: int, group: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-8, 8, (n, k), generator=g, dtype=torch.int8)
    scales = (torch.rand(n, k // group, generator=g) * 0.05 + 1e-3).to(torch.bfloat16)
    dense = (q.double().view(n, k // group, group) * scales.double().unsqueeze(-1)).view(n, k)
    return lowbit.pack_int4(q), scales, dense


#: fast and generic paths; 98 rows: blocks of 4 rows and a remainder
SHAPES = [(98, 256, 32), (64, 384, 128), (40, 96, 32), (24, 80, 40), (16, 64, 64)]


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
def test_dequantization_gives_the_same_bits_as_torch(n, k, group, built):
    packed, scales, _ = _weights(n, k, group, 1)
    want = (lowbit.unpack_int4(packed).to(torch.bfloat16).view(n, k // group, group)
            * scales.unsqueeze(-1)).view(n, k)  # bf16 arithmetic, as the torch-only path computes it
    got = torch.empty(n, k, dtype=torch.bfloat16)
    built.dequant_bf16(packed.data_ptr(), scales.data_ptr(), n, k, group, got.data_ptr(), 2)
    assert torch.equal(got, want)


@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 6])
def test_float_matrix_vector_product_matches_float64(n, k, group, rows, built):
    packed, scales, dense = _weights(n, k, group, 2)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    y = torch.empty(rows, n)
    built.gemv_f32(x.data_ptr(), rows, packed.data_ptr(), scales.data_ptr(), n, k, group, y.data_ptr(), 2)
    want = x.double() @ dense.t()
    assert float((y.double() - want).abs().max() / want.abs().max()) < 1e-5


def _token_rows(rows: int, k: int) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(7)) * torch.logspace(-3, 2, rows).unsqueeze(1)
    x[0] = x[0].abs()  # no negative value: the zero point at the bottom
    if rows > 2:
        x[2] = 0.0  # all zeros: the smallest-normal scale
    return x


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_bf16_activation_quantization_is_torchaos_integers(rows, built):
    x = _token_rows(rows, 192)
    centered, token_scale = lowbit.quantize_per_token(x)
    got, got_scale = torch.empty(rows, 192, dtype=torch.bfloat16), torch.empty(rows)
    assert built.quantize_rows_bf16(x.data_ptr(), rows, 192, got.data_ptr(), got_scale.data_ptr(), 2) == 0
    assert torch.equal(got.float(), centered.reshape(rows, 192))
    assert torch.equal(got_scale, torch.as_tensor(token_scale, dtype=torch.float32).reshape(-1))


@pytest.mark.skipif(KERNELS is None or not KERNELS.has_vnni, reason="this CPU (or build) has no AVX-512 VNNI")
@pytest.mark.parametrize(("group", "rows"), [(32, 1), (32, 4), (64, 3), (128, 2), (256, 1)])
def test_8bit_activation_product_is_torchaos_arithmetic(group, rows):
    """8da4w: torchao quantizes the activations per token (checked bit for bit in test_lowbit.py), dequantizes
    them and multiplies in float; the VNNI kernel's integer sums must give the same product."""
    n, k = 82, 512  # 20 blocks of 4 rows and 2 rows on their own (the one-token kernel)
    packed, scales, dense = _weights(n, k, group, 3)
    x = _token_rows(rows, k)
    xu, token_scale, zp128 = torch.empty(rows, k, dtype=torch.uint8), torch.empty(rows), torch.empty(rows)
    assert KERNELS.quantize_rows(x.data_ptr(), rows, k, xu.data_ptr(), token_scale.data_ptr(), zp128.data_ptr()) == 0
    y = torch.empty(rows, n)
    KERNELS.q8q4_gemv(xu.data_ptr(), rows, token_scale.data_ptr(), zp128.data_ptr(), packed.data_ptr(),
                      scales.data_ptr(), n, k, group, y.data_ptr(), 2)
    want = lowbit.fake_quant_per_token(x).double() @ dense.t()
    assert float((y.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)) < 1e-5


def test_a_nan_or_infinity_in_8bit_activations_propagates_like_torchao():
    packed, scales, _ = _weights(64, 256, 32, 4)
    for bad in (float("nan"), float("inf")):
        for rows in (1, 9):  # the matrix-vector and the GEMM path
            x = torch.randn(rows, 256)
            x[0, 5] = bad
            y = torch.ops.edgetorch.linear_q4(x, packed, scales, None, 32, True)
            assert torch.isnan(y[0]).all() and torch.isfinite(y[1:]).all()  # torchao's row is NaN too


@pytest.mark.parametrize(("arg", "message"), [
    ("scales", "scales must be"), ("group", "does not divide"), ("x", "last dimension"), ("weight", "weight must")])
def test_disagreeing_shapes_are_refused_before_any_pointer_reaches_c(arg, message):
    packed, scales, _ = _weights(64, 256, 32, 5)
    x, group = torch.randn(1, 256), 32
    if arg == "scales":
        scales = scales[:, :4]  # too few groups: the kernel would read past the end
    elif arg == "group":
        group = 48
    elif arg == "x":
        x = torch.randn(1, 512)
    else:
        packed = packed.to(torch.int32)
    with pytest.raises(ValueError, match=message):
        torch.ops.edgetorch.linear_q4(x, packed, scales, None, group, True)


def test_the_build_is_private_cached_and_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETORCH_CACHE_DIR", str(tmp_path))
    cc = native._compiler()
    first = native._build(cc)
    assert first.parent == tmp_path / "native" and first.suffix == ".so"
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary file left
    mtime = first.stat().st_mtime_ns
    assert native._build(cc) == first and first.stat().st_mtime_ns == mtime  # built once
    os.chmod(first, 0o777)
    with pytest.raises(PermissionError, match="not private"):
        native._build(cc)  # a library others can write is never loaded


def test_without_a_compiler_or_when_disabled_the_torch_kernels_run(monkeypatch):
    monkeypatch.setenv("EDGETORCH_NATIVE", "0")
    assert native._load() == (None, "disabled by EDGETORCH_NATIVE=0")
    monkeypatch.delenv("EDGETORCH_NATIVE")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    kernels, why = native._load()
    assert kernels is None and "no C compiler" in why


@pytest.fixture(scope="module")
def linear_8da4w():
    """A one-Linear program through the 8da4w recipe (groups of 32): its ``linear_q4`` runs the native kernels."""
    from edgetorch.export import ExportRecipe, PortableRecipeType, export

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 64)).eval()
    x = torch.randn(1, 256)
    session = export(model, [(x,)], ExportRecipe.get_recipe(
        PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR, group_size=32))
    return session.get_executorch_program_manager().buffer, x


@pytest.mark.parametrize("group", [16, 64, 0, -32])
def test_a_program_whose_group_size_disagrees_with_its_scales_is_refused(linear_8da4w, group):
    """An attacker's edit (decode, change the group size, re-encode with a valid hash): the scales then describe
    fewer or more groups than the kernel would read. The run stops with a typed error naming the op and the
    argument, never a read past the scales' bytes."""
    from edgetorch.errors import KernelError
    from edgetorch.formats import program as pf
    from edgetorch.runtime import Runtime
    from tests.fuzz.pte_edit import add_value, edit

    data, x = linear_8da4w

    def mutate(prog: pf.ProgramDef) -> None:
        p = prog.plans[0]
        c = next(i.call for i in p.instructions if isinstance(i.call, pf.KernelCallDef)
                 and p.operators[i.call.op_index].name == "edgetorch::linear_q4")
        c.args[4] = add_value(p, group)

    method = Runtime.get().load_program(edit(data, mutate)).load_method("forward")
    with pytest.raises(KernelError, match=r"linear_q4.*(scales must be|does not divide)"):
        method.execute(x)


def test_the_native_path_keeps_no_second_copy_of_any_weight(monkeypatch):
    """Decode and prefill on the native kernels leave no cached layout behind (the torch-only path caches
    ``_weight_int4pack_mm_for_cpu``'s own copy of each weight: resident memory 1.4-1.5x the program)."""
    monkeypatch.setattr(lowbit, "_CACHE", {})
    packed, scales, dense = _weights(64, 256, 32, 6)
    for rows in (1, 3, 12):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
        y = torch.ops.edgetorch.linear_q4(x, packed, scales, None, 32, True)
        want = lowbit.fake_quant_per_token(x).double() @ dense.t()
        assert float((y.double() - want).abs().max() / want.abs().max()) < 2e-2
    assert lowbit._CACHE == {}
    monkeypatch.setattr(native, "kernels", lambda: None)
    torch.ops.edgetorch.linear_q4(torch.randn(1, 256), packed, scales, None, 32, True)
    assert len(lowbit._CACHE) == 1  # the check above would see a cached copy


def test_a_failing_compiler_or_a_shared_cache_folder_falls_back_and_says_why(tmp_path, monkeypatch):
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'q4.c: error: this compiler refuses' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("EDGETORCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(failing))
    kernels, why = native._load()
    assert kernels is None and why.startswith("build failed") and "this compiler refuses" in why
    shared = tmp_path / "shared"
    (shared / "native").mkdir(parents=True)
    os.chmod(shared / "native", 0o777)  # others could plant a library there
    monkeypatch.setenv("EDGETORCH_CACHE_DIR", str(shared))
    monkeypatch.delenv("CC")
    kernels, why = native._load()
    assert kernels is None and "is not private to this user" in why
