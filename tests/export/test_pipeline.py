"""Stage-order rules, input validation, custom stages and the recipe registry of ``edgetorch.export``."""

from __future__ import annotations

import pytest
import torch

from edgetorch.errors import EdgeTorchError, MethodNotFoundError
from edgetorch.export import (
    BackendRecipeProvider,
    ExportInputError,
    ExportRecipe,
    ExportSession,
    ExportSessionError,
    LoweringRecipe,
    PipelineArtifact,
    PipelineError,
    PortableRecipeType,
    QuantizationRecipe,
    RecipeError,
    RecipeType,
    Stage,
    StageType,
    UnsupportedModelError,
    export,
    recipe_registry,
    register_backend_recipe_provider,
)
from edgetorch.export.quantizer import SymmetricInt8Quantizer

S = StageType


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


X = (torch.randn(2, 8),)


@pytest.fixture(scope="module")
def ep():
    return torch.export.export(Tiny().eval(), X)


@pytest.fixture(scope="module")
def gm():
    return torch.export.export(Tiny().eval(), X).module()


def session(model, stages=None, inputs=((X,)), **kw):
    recipe = ExportRecipe(pipeline_stages=stages) if stages is not None else None
    return ExportSession(model, list(inputs) if inputs is not None else None, recipe, **kw)


# -- default pipelines ------------------------------------------------------------------------------------------
def test_default_pipeline_per_input_type(ep, gm):
    assert session(Tiny()).pipeline_stages == [S.SOURCE_TRANSFORM, S.QUANTIZE, S.TORCH_EXPORT,
                                               S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH]
    assert session(gm).pipeline_stages == [S.TORCH_EXPORT, S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH]
    s = session(ep, inputs=None)
    assert s.pipeline_stages == [S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH]
    assert s.input_model_type == "ExportedProgram"
    assert set(s.get_all_registered_stages()) == {S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH}


# -- invalid sequences -------------------------------------------------------------------------------------------
INVALID = [
    # (input kind, stages, fragments the message must contain)
    ("module", [], ["empty"]),
    ("module", [S.TORCH_EXPORT, S.TO_EXECUTORCH], ["invalid transition", "TORCH_EXPORT", "TO_EXECUTORCH"]),
    ("module", [S.TORCH_EXPORT, S.TO_EDGE, S.TO_EXECUTORCH], ["invalid transition from TO_EDGE to TO_EXECUTORCH"]),
    ("module", [S.QUANTIZE, S.TO_EDGE_TRANSFORM_AND_LOWER], ["invalid transition from QUANTIZE"]),
    ("module", [S.TORCH_EXPORT, S.QUANTIZE, S.TO_EDGE], ["invalid transition from TORCH_EXPORT to QUANTIZE"]),
    ("module", [S.TORCH_EXPORT, S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_BACKEND], ["TO_BACKEND can only follow"]),
    ("module", [S.TORCH_EXPORT, S.TO_EDGE, S.TO_EDGE_TRANSFORM_AND_LOWER], ["invalid transition"]),
    ("module", [S.TORCH_EXPORT, S.TORCH_EXPORT], ["appears twice"]),
    ("module", [S.TO_EDGE, S.TO_EXECUTORCH], ["needs exported programs", "nn.Module", "TORCH_EXPORT"]),
    ("graph", [S.QUANTIZE, S.TORCH_EXPORT, S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH],
     ["QUANTIZE", "GraphModule", "already quantized"]),
    ("graph", [S.SOURCE_TRANSFORM, S.TORCH_EXPORT], ["SOURCE_TRANSFORM", "GraphModule"]),
    ("ep", [S.TORCH_EXPORT, S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH], ["TORCH_EXPORT", "already exported"]),
    ("ep", [S.QUANTIZE, S.TO_EDGE], ["QUANTIZE", "ExportedProgram"]),
    ("ep", [S.TO_EXECUTORCH], ["TO_EXECUTORCH cannot start a pipeline"]),
    ("ep", [S.TO_BACKEND, S.TO_EXECUTORCH], ["TO_BACKEND cannot start a pipeline"]),
    ("ep", [S.EDGE_PROGRAM_MANAGER_TRANSFORM, S.TO_EXECUTORCH], ["cannot start a pipeline"]),
]


@pytest.mark.parametrize("kind,stages,fragments", INVALID, ids=[f"{k}-{'-'.join(s.name for s in st) or 'empty'}"
                                                                for k, st, _ in INVALID])
def test_invalid_pipelines_raise_before_running(kind, stages, fragments, ep, gm):
    model = {"module": Tiny(), "graph": gm, "ep": ep}[kind]
    s = session(model, stages, inputs=None if kind == "ep" else (X,))
    with pytest.raises(PipelineError) as info:
        s.export()
    for f in fragments:
        assert f in str(info.value)
    assert s.get_stage_artifacts() == {}  # nothing ran


VALID = [
    [S.TORCH_EXPORT, S.TO_EDGE, S.TO_BACKEND, S.TO_EXECUTORCH],
    [S.TORCH_EXPORT, S.TO_EDGE, S.EDGE_PROGRAM_MANAGER_TRANSFORM, S.TO_BACKEND, S.TO_EXECUTORCH],
    [S.TORCH_EXPORT, S.TO_EDGE_TRANSFORM_AND_LOWER, S.EDGE_PROGRAM_MANAGER_TRANSFORM, S.TO_EXECUTORCH],
    [S.QUANTIZE, S.TORCH_EXPORT, S.TO_EDGE_TRANSFORM_AND_LOWER, S.TO_EXECUTORCH],
    [S.SOURCE_TRANSFORM, S.TORCH_EXPORT, S.TO_EDGE, S.TO_BACKEND, S.TO_EXECUTORCH],
]


@pytest.mark.parametrize("stages", VALID, ids=["-".join(s.name for s in st) for st in VALID])
def test_valid_alternative_pipelines_run(stages):
    model = Tiny().eval()
    s = session(model, stages)
    s.export()
    assert list(s.get_stage_artifacts()) == stages
    torch.testing.assert_close(s.run_method("forward", X)[0], model(*X), rtol=1e-5, atol=1e-6)


def test_pipeline_may_stop_at_edge():
    s = session(Tiny().eval(), [S.TORCH_EXPORT, S.TO_EDGE])
    s.export()
    assert s.get_edge_program_manager().methods == {"forward"}
    with pytest.raises(ExportSessionError, match="TO_EXECUTORCH stage has not run"):
        s.get_pte_buffer()


# -- custom stages -----------------------------------------------------------------------------------------------
class DoubleWeights(Stage):
    """A custom SOURCE_TRANSFORM: doubles every Linear weight of a copy of each module."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @property
    def stage_type(self) -> StageType:
        return StageType.SOURCE_TRANSFORM

    def run(self, artifact: PipelineArtifact) -> None:
        import copy
        self.calls += 1
        out = {}
        for method, m in artifact.data.items():
            m = copy.deepcopy(m)
            with torch.no_grad():
                m.fc.weight.mul_(2)
            out[method] = m
        self._artifact = artifact.copy_with_new_data(out)


def test_register_custom_stage_replaces_default():
    model = Tiny().eval()
    s = ExportSession(model, [X])
    custom = DoubleWeights()
    s.register_stage(StageType.SOURCE_TRANSFORM, custom)
    assert s.get_registered_stage(StageType.SOURCE_TRANSFORM) is custom
    s.export()
    assert custom.calls == 1
    with torch.no_grad():
        want = torch.relu(torch.nn.functional.linear(X[0], model.fc.weight * 2, model.fc.bias))
    torch.testing.assert_close(s.run_method("forward", X)[0], want, rtol=1e-5, atol=1e-6)
    assert s.stage_durations_ms[StageType.SOURCE_TRANSFORM] >= 0
    assert s.get_stage_artifacts()[StageType.SOURCE_TRANSFORM].get_context("duration_ms") >= 0


class ReturningExport(Stage):
    """A custom TORCH_EXPORT that returns its artifact instead of storing it, and only follows QUANTIZE."""

    @property
    def stage_type(self) -> StageType:
        return StageType.TORCH_EXPORT

    @property
    def valid_predecessor_stages(self) -> list[StageType]:
        return [StageType.QUANTIZE]

    def run(self, artifact: PipelineArtifact) -> PipelineArtifact:
        inputs = artifact.get_context("example_inputs")
        return artifact.copy_with_new_data({m: torch.export.export(mod, inputs[m][0])
                                            for m, mod in artifact.data.items()})


def test_custom_stage_predecessors_and_returned_artifact():
    s = ExportSession(Tiny().eval(), [X])  # default pipeline: ... QUANTIZE -> TORCH_EXPORT ...
    s.register_stage(StageType.TORCH_EXPORT, ReturningExport())
    s.export()
    assert isinstance(s.get_exported_program(), torch.export.ExportedProgram)
    s2 = ExportSession(Tiny().eval(), [X], ExportRecipe(pipeline_stages=[S.SOURCE_TRANSFORM, S.TORCH_EXPORT]))
    s2.register_stage(StageType.TORCH_EXPORT, ReturningExport())
    with pytest.raises(PipelineError, match="TORCH_EXPORT can only follow \\['QUANTIZE'\\]"):
        s2.export()


class Failing(Stage):
    @property
    def stage_type(self) -> StageType:
        return StageType.SOURCE_TRANSFORM

    def run(self, artifact: PipelineArtifact) -> None:
        raise ValueError("boom")


class Lazy(Stage):
    @property
    def stage_type(self) -> StageType:
        return StageType.SOURCE_TRANSFORM

    def run(self, artifact: PipelineArtifact) -> None:
        pass  # forgets to store an artifact


def test_stage_failures_raise_typed_errors():
    s = ExportSession(Tiny(), [X])
    s.register_stage(StageType.SOURCE_TRANSFORM, Failing())
    with pytest.raises(ExportSessionError, match="stage SOURCE_TRANSFORM \\(Failing\\) failed: ValueError: boom") as e:
        s.export()
    assert isinstance(e.value.__cause__, ValueError)
    s.register_stage(StageType.SOURCE_TRANSFORM, Lazy())
    with pytest.raises(ExportSessionError, match="has not produced an artifact"):
        s.export()


def test_register_stage_rejects_mismatches():
    s = ExportSession(Tiny(), [X])
    with pytest.raises(PipelineError, match="cannot register a SOURCE_TRANSFORM stage"):
        s.register_stage(StageType.TORCH_EXPORT, DoubleWeights())
    with pytest.raises(PipelineError, match="Stage instance"):
        s.register_stage(StageType.TORCH_EXPORT, object())  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="StageType"):
        s.register_stage("torch_export", DoubleWeights())  # type: ignore[arg-type]
    assert s.get_registered_stage(StageType.TO_BACKEND) is None


# -- getters before export / bad lookups ----------------------------------------------------------------------
def test_getters_raise_before_export():
    s = ExportSession(Tiny(), [X])
    for call in (s.get_exported_program, s.get_edge_program_manager, s.get_executorch_program_manager,
                 s.get_executorch_program, s.get_pte_buffer, s.get_etrecord, s.print_delegation_info, s.run_method):
        with pytest.raises(ExportSessionError):
            call()
    with pytest.raises(ExportSessionError, match="not produced an artifact"):
        DoubleWeights().get_artifacts()
    with pytest.raises(MethodNotFoundError, match="no method 'nope'"):
        s.get_example_input("nope")


def test_lookups_after_export():
    s = export(Tiny().eval(), [X])
    with pytest.raises(MethodNotFoundError, match="methods: \\['forward'\\]"):
        s.get_exported_program("encode")
    with pytest.raises(MethodNotFoundError):
        s.get_delegation_info("encode")
    with pytest.raises(ExportSessionError, match="generate_etrecord=True"):
        s.get_etrecord()
    with pytest.raises(EdgeTorchError):
        s.run_method("encode", X)[0]
    assert s.get_example_input() is not None
    assert s.get_executorch_program().plans[0].name == "forward"


# -- input validation -----------------------------------------------------------------------------------------
def test_bad_models_and_inputs(tmp_path, ep):
    with pytest.raises(UnsupportedModelError, match="unsupported model type int"):
        ExportSession(3, [X])  # type: ignore[arg-type]
    with pytest.raises(UnsupportedModelError, match="one kind"):
        ExportSession({"forward": Tiny(), "other": ep}, {"forward": [X], "other": [X]})
    with pytest.raises(UnsupportedModelError, match="empty"):
        ExportSession({}, [X])
    with pytest.raises(ExportInputError, match="example_inputs are required when the model is a nn.Module"):
        ExportSession(Tiny())
    with pytest.raises(ExportInputError, match="list of input tuples"):
        ExportSession(Tiny(), X[0])
    with pytest.raises(ExportInputError, match="example input 0 of method 'forward' is a Tensor"):
        ExportSession(Tiny(), [X[0]])
    with pytest.raises(ExportInputError, match="are empty"):
        ExportSession(Tiny(), [])
    with pytest.raises(ExportInputError, match="that the model does not have"):
        ExportSession(Tiny(), {"encode": [X]})
    with pytest.raises(ExportInputError, match="give example_inputs as"):
        ExportSession({"forward": Tiny(), "b": Tiny()}, [X])
    with pytest.raises(ExportInputError, match="no example inputs for methods \\['b'\\]"):
        ExportSession({"forward": Tiny(), "b": Tiny()}, {"forward": [X]})
    with pytest.raises(ExportInputError, match="file stem"):
        ExportSession(Tiny(), [X], name="a/b")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ExportInputError, match="not a directory"):
        ExportSession(Tiny(), [X], artifact_dir=str(f))
    with pytest.raises(ExportInputError, match="must be an ExportRecipe"):
        ExportSession(Tiny(), [X], export_recipe="fp32")  # type: ignore[arg-type]
    with pytest.raises(ExportInputError, match="cannot read saved ExportedProgram"):
        ExportSession(str(tmp_path / "missing.pt2"))


# -- recipes ------------------------------------------------------------------------------------------------------
def test_portable_recipes():
    fp32 = ExportRecipe.get_recipe(PortableRecipeType.FP32)
    assert fp32.quantization_recipe is None and fp32.backend == "portable"
    for t in (PortableRecipeType.INT8_STATIC_PER_CHANNEL, PortableRecipeType.INT8_STATIC_PER_TENSOR,
              PortableRecipeType.INT8_DYNAMIC_PER_CHANNEL):
        r = ExportRecipe.get_recipe(t)
        (q,) = r.quantization_recipe.get_quantizers()
        assert isinstance(q, SymmetricInt8Quantizer)
        assert q.config.per_channel == (t != PortableRecipeType.INT8_STATIC_PER_TENSOR)
        assert q.config.dynamic == (t == PortableRecipeType.INT8_DYNAMIC_PER_CHANNEL)
    r = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL, activation_observer="histogram")
    assert r.quantization_recipe.quantizers[0].config.activation_observer == "histogram"
    with pytest.raises(RecipeError, match="activation_observer"):
        ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL, group_size=32)
    with pytest.raises(RecipeError, match="'minmax' or 'histogram'"):
        ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL, activation_observer="mse")
    with pytest.raises(RecipeError, match="no arguments"):
        ExportRecipe.get_recipe(PortableRecipeType.FP32, x=1)
    with pytest.raises(RecipeError, match="RecipeType enum member"):
        ExportRecipe.get_recipe("portable_fp32")  # type: ignore[arg-type]
    assert "portable" in recipe_registry.list_backends()
    assert set(recipe_registry.get_supported_recipes("portable")) == set(PortableRecipeType)


class ToyRecipeType(RecipeType):
    A = "toy_a"
    B = "toy_b"

    @classmethod
    def get_backend_name(cls) -> str:
        return "toy"


class ToyProvider(BackendRecipeProvider):
    @property
    def backend_name(self) -> str:
        return "toy"

    def get_supported_recipes(self):
        return [ToyRecipeType.A]

    def create_recipe(self, recipe_type, **kwargs):
        return ExportRecipe(name="toy_a", lowering_recipe=LoweringRecipe(partitioner=["p_toy"]))


class GhostRecipeType(RecipeType):
    X = "ghost_x"

    @classmethod
    def get_backend_name(cls) -> str:
        return "ghost"


def test_registering_a_provider_is_one_call():
    register_backend_recipe_provider(ToyProvider())
    r = ExportRecipe.get_recipe(ToyRecipeType.A)
    assert r.name == "toy_a" and r.backend == "toy" and r.lowering_recipe.partitioners == ["p_toy"]
    with pytest.raises(RecipeError, match="backend 'toy' cannot build recipe B; it supports: \\['A'\\]"):
        ExportRecipe.get_recipe(ToyRecipeType.B)
    with pytest.raises(RecipeError, match="no recipe provider is registered for backend 'ghost'"):
        ExportRecipe.get_recipe(GhostRecipeType.X)
    with pytest.raises(RecipeError, match="BackendRecipeProvider"):
        register_backend_recipe_provider(object())  # type: ignore[arg-type]


def test_combine_recipes():
    from edgetorch.exir import EdgeCompileConfig, ExecutorchBackendConfig

    cfg = ExecutorchBackendConfig(alignment=128)
    a = ExportRecipe(name="a", aten_transform_passes=[print], executorch_backend_config=cfg,
                     lowering_recipe=LoweringRecipe(partitioners=["p1"], edge_compile_config=EdgeCompileConfig()))
    b = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_TENSOR)
    b.lowering_recipe = LoweringRecipe(["p2"], edge_transform_passes=[len])
    c = ExportRecipe.combine([a, b])
    assert c.name == "a_portable_int8_static_per_tensor"
    assert c.aten_transform_passes == [print]
    assert c.lowering_recipe.partitioners == ["p1", "p2"]
    assert c.lowering_recipe.edge_transform_passes == [len]
    assert c.lowering_recipe.edge_compile_config is a.lowering_recipe.edge_compile_config
    assert c.executorch_backend_config.alignment == 128 and c.executorch_backend_config is not cfg
    assert len(c.quantization_recipe.quantizers) == 1
    assert ExportRecipe.combine([a, b], recipe_name="both").name == "both"
    assert ExportRecipe.combine([a]).name == "a"
    with pytest.raises(RecipeError, match="non-empty list"):
        ExportRecipe.combine([])
    with pytest.raises(RecipeError, match="not both"):
        LoweringRecipe(partitioners=[1], partitioner=[2])
    with pytest.raises(RecipeError, match="StageType"):
        ExportRecipe(pipeline_stages=["to_edge"])
    with pytest.raises(RecipeError, match="must be a list"):
        QuantizationRecipe(quantizers=SymmetricInt8Quantizer())


def test_non_torchao_quantizer_is_rejected():
    recipe = ExportRecipe(quantization_recipe=QuantizationRecipe(quantizers=["not a quantizer"]))
    with pytest.raises(RecipeError, match="torchao.quantization.pt2e.quantizer.Quantizer"):
        export(Tiny(), [X], recipe)


def test_dynamic_shapes_normalization():
    batch = torch.export.Dim("batch", min=1, max=8)
    positional = ({0: batch},)
    assert ExportSession(Tiny(), [X], dynamic_shapes=positional)._dynamic_shapes == {"forward": positional}
    by_name = {"x": {0: batch}}  # a dict of argument names is not mistaken for a per-method dict
    assert ExportSession(Tiny(), [X], dynamic_shapes=by_name)._dynamic_shapes == {"forward": by_name}
    two = {"forward": Tiny(), "b": Tiny()}
    per_method = {"b": positional}
    assert ExportSession(two, {"forward": [X], "b": [X]}, dynamic_shapes=per_method)._dynamic_shapes == per_method
    with pytest.raises(ExportInputError, match="give dynamic_shapes as"):
        ExportSession(two, {"forward": [X], "b": [X]}, dynamic_shapes=positional)


def test_quantization_recipe_on_graph_module_input_is_not_silent(gm, caplog):
    recipe = ExportRecipe.get_recipe(PortableRecipeType.INT8_STATIC_PER_CHANNEL)
    with caplog.at_level("WARNING", logger="edgetorch.export.session"):
        s = ExportSession(gm, [X], recipe)
    assert S.QUANTIZE not in s.pipeline_stages
    assert "quantization is not applied to a GraphModule input" in caplog.text
