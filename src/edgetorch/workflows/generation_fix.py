"""Mixed-precision fix of a low-bit (torchao recipe) LLM, proven in tokens: the layers most responsible for the
quantized generation's departure from the float model are kept at 8 bits, or in float, until the program's
greedy tokens agree with the float model's again; each step re-exported, re-run and measured::

    from edgetorch.export import PortableRecipeType
    from edgetorch.workflows.generation_fix import find_generation_fix

    result = find_generation_fix(model, prompt, PortableRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR,
                                 tokens=32, max_reexports=4)
    print(result.summary())          # the layers kept at 8 bits / float, proven: agreement before/after
    print(result.to_dataframe())     # one row per export: layers kept, agreement, logits SQNR, size, decode time

``model`` is an LLM with ``prefill`` / ``decode`` methods and a static KV cache (``reset_cache()``): the zoo's
``Llama`` or a Hugging Face causal LM wrapped by ``edgetorch.models.hf.wrap_static_cache`` (their export inputs
and dynamic shapes are known; pass ``method_inputs`` / ``dynamic_shapes`` for another).

1. **Reference**: the float model generates ``tokens`` tokens greedily from ``prompt`` (eager PyTorch).
2. **Measure** a program: it runs the prompt and then decodes the float model's own tokens (teacher forcing), so
   each step's logits compare with the float model's on the same inputs. ``agreement`` is the number of leading
   steps whose greedy token equals the float model's: exactly the tokens a free-running generation of the
   program shares with the float model's (identical inputs up to the first difference), ``restored`` when all
   ``tokens`` agree. ``logits_sqnr_db``: 10 log10 of the float logits' power over the logit error's, all steps
   together; ``decode_ms``: the median decode step on the edgetorch runtime (a run without ETDump); the size of
   the ``.pte``.
3. **Rank**: the first ``rank_tokens`` steps of the same run recorded with an ETDump and its debug buffer;
   ``Inspector.quantized_generation_table`` against the float model with ``impact=True`` gives each quantized
   layer's mean own SQNR (its quantized op on the float model's own input), the layers whose own error is
   abnormal (``attrs["abnormal"]``) and each layer's mean logit share. The abnormal layers come first (the
   worst own SQNR first: a layer downstream of them merely inherits their error), then the others by mean share
   of the logit error (the error that changes tokens), then by mean own SQNR.
4. **Fix**, at most ``max_reexports`` exports, each keeping every layer the previous ones kept (cumulative sets:
   agreement is not monotone in the layers kept, a near tie of the float model flips either way, so the search
   never trades a kept layer for another). The first export keeps the abnormal layers in float (the outliers that
   ruined their int4 group scales ruin int8 per-channel scales as much), or, when none is abnormal, the worst
   layer at ``keep``; each later export adds the next worst layers of the best program so far (its own ranking,
   layers not kept yet), twice as many each time (2, 4, ...), at int8 weight-only (``keep="int8"``, the
   recipe's ``int8_module_paths``: 4x smaller than float) or in float (``keep="float"``,
   ``exclude_module_paths``); the last export the budget allows keeps every layer left within ``top`` (None: every
   quantized layer). The best program so far is the one with the most agreeing tokens, then the higher logits
   SQNR. A layer kept at int8 that the best program's table flags abnormal (its int8 op: outliers that int8 per
   channel cannot absorb) moves to float. The first program whose tokens all agree is the fix (``proven``);
   without one, ``best`` is reported.

``near_tie_agreement`` is reported beside ``agreement``, never instead of it: the leading steps whose greedy token
equals the float model's or whose float top-2 margin is below the program's RMS logit error at that step (the
float model's own choice is within the program's noise there: a near tie). ``proven`` needs the strict count.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from edgetorch.errors import InspectorError, RecipeError

log = logging.getLogger(__name__)

__all__ = ["GenerationFixResult", "GenerationStep", "find_generation_fix", "llm_export_args", "measure_program",
           "near_tie_agreement", "rank_layers"]


@dataclass
class GenerationStep:
    """One export: the layers kept at int8 / in float, how its tokens and logits compare with the float model's,
    its cost, and the layers its own table ranks worst."""

    reexport: int  # 0 = the baseline program
    int8: list[str]
    float: list[str]
    agreement: int  # leading greedy tokens equal to the float model's
    tokens: int
    logits_sqnr_db: float
    size_bytes: int
    decode_ms: float
    ranking: list[str] = field(default_factory=list)  # worst first (empty when not ranked)
    local_ranking: list[str] = field(default_factory=list)  # by mean own SQNR alone, worst first
    abnormal: list[str] = field(default_factory=list)  # layers whose own quantization error is abnormal
    own_sqnr_db: dict[str, float] = field(default_factory=dict)  # mean own SQNR per layer, worst first
    #: leading steps that agree or whose float top-2 margin is below the program's RMS logit error there (a near
    #: tie): beside ``agreement``, never instead of it
    near_tie_agreement: int = -1

    @property
    def restored(self) -> bool:
        return self.agreement >= self.tokens


@dataclass
class GenerationFixResult:
    """The search: one step per export (the baseline first) and the fix (None when none restored agreement)."""

    recipe: str
    tokens: int
    keep: str
    steps: list[GenerationStep] = field(default_factory=list)
    float_tokens: list[int] = field(default_factory=list)
    #: the float model's smallest top-2 logit margin over the steps, in logit standard deviations, and its step:
    #: a near tie (~0.05) flips under almost any rounding, whatever layers are kept
    float_margin: tuple[float, int] = (math.inf, -1)

    @property
    def baseline(self) -> GenerationStep:
        return self.steps[0]

    @property
    def reexports(self) -> int:
        return len(self.steps) - 1

    @property
    def ranking(self) -> list[str]:
        """The baseline program's layers, most responsible first (module paths)."""
        return self.baseline.ranking

    @property
    def fix_step(self) -> GenerationStep | None:
        return next((s for s in self.steps[1:] if s.restored), None)

    @property
    def best(self) -> GenerationStep:
        """The first restored program, else the one with the most agreeing tokens, then the higher logits SQNR."""
        return self.fix_step or max(self.steps, key=lambda s: (s.agreement, s.logits_sqnr_db))

    @property
    def fix(self) -> dict[str, list[str]] | None:
        s = self.fix_step
        return None if s is None else {"int8": list(s.int8), "float": list(s.float)}

    @property
    def proven(self) -> bool:
        return self.fix_step is not None

    def to_dataframe(self) -> pd.DataFrame:
        rows = []
        for s in self.steps:
            rows.append({"reexport": s.reexport, "int8": ", ".join(s.int8) or "-", "float": ", ".join(s.float) or "-",
                         "agreement": f"{s.agreement}/{s.tokens}", "restored": s.restored,
                         "near_tie_agreement": f"{s.near_tie_agreement}/{s.tokens}",
                         "logits_sqnr_db": s.logits_sqnr_db, "size_bytes": s.size_bytes, "decode_ms": s.decode_ms,
                         "worst_layer": s.ranking[0] if s.ranking else "-"})
        return pd.DataFrame(rows)

    def summary(self) -> str:
        b = self.baseline
        head = (f"{self.recipe}: baseline agrees with the float model on {b.agreement}/{b.tokens} greedy tokens "
                f"(logits SQNR {b.logits_sqnr_db:.1f} dB), most responsible layer "
                f"{b.ranking[0] if b.ranking else '-'}; {self.reexports} re-export(s)")
        if b.restored:
            return head + ": already in agreement, nothing to fix"
        s = self.fix_step
        if s is None:
            best = self.best
            margin, at = self.float_margin
            return head + (f": no fix within the re-export budget (best: re-export {best.reexport}, "
                           f"{best.agreement}/{b.tokens} tokens, {best.near_tie_agreement}/{b.tokens} counting the "
                           f"float model's near ties, logits SQNR {best.logits_sqnr_db:.1f} dB, kept int8 "
                           f"{best.int8 or '-'}, float {best.float or '-'}; the float model's own choice at step "
                           f"{at} leads by {margin:.3f} logit std)")
        kept = ([f"{', '.join(s.int8)} at int8"] if s.int8 else []) + ([f"{', '.join(s.float)} in float"]
                                                                        if s.float else [])
        return (f"{head}: keep {' and '.join(kept)} -> {s.agreement}/{s.tokens} tokens agree (proven), logits "
                f"SQNR {s.logits_sqnr_db:.1f} dB, size {s.size_bytes} vs {b.size_bytes} bytes "
                f"({s.size_bytes / b.size_bytes:.2f}x), decode {s.decode_ms:.3f} vs {b.decode_ms:.3f} ms/token")


# -- exporting --------------------------------------------------------------------------------------------------
def llm_export_args(model: torch.nn.Module) -> tuple[dict[str, tuple], dict[str, Any], bool]:
    """``(method inputs, dynamic shapes, strict)`` to export ``model`` as prefill + decode: the zoo's Llama or a
    Hugging Face causal LM wrapped by ``edgetorch.models.hf.wrap_static_cache``."""
    from edgetorch.models.llama import Llama, llama_dynamic_shapes, llama_method_inputs

    if isinstance(model, Llama):
        return llama_method_inputs(model.config), llama_dynamic_shapes(model.config), False
    inner = getattr(model, "model", None)
    if hasattr(model, "max_cache_len") and hasattr(getattr(inner, "config", None), "get_text_config"):
        from edgetorch.models import hf

        vocab = inner.config.get_text_config().vocab_size
        return hf.hf_method_inputs(vocab), hf.hf_dynamic_shapes(model.max_cache_len), True
    raise RecipeError(f"find_generation_fix: cannot tell how to export a {type(model).__name__} as prefill + decode: "
                      "pass method_inputs= and dynamic_shapes= (a zoo Llama or an hf.wrap_static_cache wrapper "
                      "needs neither)")


def _export(model: torch.nn.Module, recipe_type: Any, options: dict[str, Any], export_args: tuple,
            etrecord: bool) -> Any:
    from edgetorch.export import ExportRecipe, export

    inputs, shapes, strict = export_args
    recipe = ExportRecipe.get_recipe(recipe_type, **options)
    recipe.strict = recipe.strict or strict
    session = export({"prefill": model, "decode": model}, {k: [tuple(v)] for k, v in inputs.items()}, recipe,
                     dynamic_shapes=shapes, generate_etrecord=etrecord)
    return session.get_executorch_program_manager()


# -- measuring --------------------------------------------------------------------------------------------------
def _float_reference(model: torch.nn.Module, prompt: torch.Tensor, tokens: int) -> tuple[list[int], torch.Tensor]:
    from edgetorch.models.generation import greedy_generate_with_logits

    with torch.no_grad():
        if hasattr(model, "reset_cache"):
            model.reset_cache()
        got = greedy_generate_with_logits(model.prefill, model.decode, prompt, tokens)
        if hasattr(model, "reset_cache"):
            model.reset_cache()
    return got.tokens, torch.stack(got.step_logits)


def _forced(prefill: Callable, decode: Callable, prompt: torch.Tensor, float_tokens: list[int],
            times: list[float] | None = None) -> torch.Tensor:
    """The program's logits per step, fed the prompt then the float model's tokens: ``(tokens, vocab)``."""
    from edgetorch.models.generation import as_logits

    n = prompt.shape[1]
    rows = [as_logits(prefill(prompt.to(torch.long), torch.arange(n)))[0, -1].float()]
    for i, tok in enumerate(float_tokens[:-1]):
        t0 = time.perf_counter()
        out = as_logits(decode(torch.tensor([[tok]]), torch.tensor([n + i])))
        if times is not None:
            times.append(time.perf_counter() - t0)
        rows.append(out[0, -1].float())
    return torch.stack(rows)


def _margin(logits: torch.Tensor) -> tuple[float, int]:
    """The smallest top-2 margin of ``(steps, vocab)`` logits over their standard deviation, and its step."""
    if logits.shape[-1] < 2:
        return math.inf, -1
    top = logits.double().topk(2, -1).values
    margin = (top[:, 0] - top[:, 1]) / logits.double().std(-1).clamp_min(1e-30)
    return float(margin.min()), int(margin.argmin())


def _agreement(logits: torch.Tensor, float_tokens: list[int]) -> int:
    greedy = logits.argmax(-1).tolist()
    return next((i for i, (a, b) in enumerate(zip(greedy, float_tokens)) if a != b), len(float_tokens))


def near_tie_agreement(logits: torch.Tensor, float_logits: torch.Tensor, float_tokens: list[int]) -> int:
    """The leading steps whose greedy token equals the float model's, or whose float top-2 margin is below the
    program's RMS logit error at that step (the float model's own choice lies within the program's noise there).
    Reported beside :func:`_agreement`'s strict count, never instead of it."""
    ref, got = float_logits.double(), logits.double()
    top = ref.topk(2, -1).values if ref.shape[-1] >= 2 else ref.new_full((ref.shape[0], 2), math.inf)
    margin = top[:, 0] - top[:, 1]
    rms = (got - ref).pow(2).mean(-1).sqrt()
    greedy = got.argmax(-1).tolist()
    return next((i for i, (a, b) in enumerate(zip(greedy, float_tokens)) if a != b and not margin[i] < rms[i]),
                len(float_tokens))


def _sqnr(ref: torch.Tensor, got: torch.Tensor) -> float:
    noise = float((ref.double() - got.double()).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(ref.double().pow(2).sum()) / noise)


def measure_program(pte: bytes, prompt: torch.Tensor, float_tokens: list[int],
                    float_logits: torch.Tensor) -> tuple[int, float, float]:
    """``(agreement, logits SQNR dB, median decode ms)`` of a prefill + decode program fed the prompt then the
    float model's tokens (see the module docstring)."""
    agree, _, sqnr, ms = _measure(pte, prompt, float_tokens, float_logits)
    return agree, sqnr, ms


def _measure(pte: bytes, prompt: torch.Tensor, float_tokens: list[int],
             float_logits: torch.Tensor) -> tuple[int, int, float, float]:
    """:func:`measure_program` with :func:`near_tie_agreement` second."""
    from edgetorch.runtime import Runtime

    prog = Runtime.get().load_program(pte)
    times: list[float] = []
    logits = _forced(prog.load_method("prefill").execute, prog.load_method("decode").execute, prompt,
                     float_tokens, times)
    ms = 1000 * statistics.median(times) if times else math.nan
    return (_agreement(logits, float_tokens), near_tie_agreement(logits, float_logits, float_tokens),
            _sqnr(float_logits, logits), ms)


def rank_layers(et: Any, model: torch.nn.Module, prompt: torch.Tensor,
                float_tokens: list[int]) -> tuple[list[str], dict[str, float], list[str]]:
    """The quantized layers of program ``et`` (exported with an ETRecord), most responsible first: the run fed
    the float model's tokens ``float_tokens``, recorded, and ``quantized_generation_table(model, impact=True)``
    (the layers whose own error is abnormal first, then by mean logit share, then mean own SQNR); the mean own
    SQNR per layer, worst first (the table's ``attrs["ranking"]``); and the abnormal layers (``attrs["abnormal"]``)."""
    from edgetorch.devtools import Inspector
    from edgetorch.runtime import Runtime

    prog = Runtime.get().load_program(et.buffer, enable_etdump=True, debug_buffer_size="auto")
    with torch.no_grad():
        _forced(prog.load_method("prefill").execute, prog.load_method("decode").execute, prompt, float_tokens)
    with tempfile.TemporaryDirectory() as d:
        dump, dbg = os.path.join(d, "g.etdp"), os.path.join(d, "g_debug.bin")
        prog.write_etdump_result_to_file(dump, dbg)
        insp = Inspector(etdump_path=dump, etrecord=et.get_etrecord(), debug_buffer_path=dbg)
        df = insp.quantized_generation_table(model, impact=True)
    if hasattr(model, "reset_cache"):
        model.reset_cache()
    own = {str(p): float(v) for p, v in df.attrs["ranking"].items()}
    return _ranking(df), own, list(df.attrs.get("abnormal", []))


def _ranking(df: pd.DataFrame) -> list[str]:
    """Abnormal layers first (the worst own SQNR first: the error they add by themselves is out of line, where a
    layer downstream of them merely inherits theirs), then by mean logit share (the error that changes tokens),
    then by mean own SQNR."""
    own = df.attrs["ranking"]  # mean own SQNR, worst first
    abnormal = {p: i for i, p in enumerate(df.attrs.get("abnormal", []))}
    share = df.groupby("layer", sort=False)["logit_share"].mean() if "logit_share" in df else None
    order = {p: i for i, p in enumerate(own.index)}
    def key(p: str) -> tuple[int, float, int]:
        s = float(share.get(p, math.nan)) if share is not None else math.nan
        return (abnormal.get(p, len(abnormal)), -s if s == s else math.inf, order.get(p, len(order)))
    return sorted(dict.fromkeys(df["layer"]), key=key)


# -- search -----------------------------------------------------------------------------------------------------
def _next_kept(ranking: list[str], int8: list[str], flt: list[str], keep: str, width: int | None,
               top: int | None, abnormal: tuple[str, ...] | list[str] = ()) -> tuple[list[str], list[str]] | None:
    """The layers kept after the next step: every layer kept so far, plus the ``width`` (None: all) worst layers
    of ``ranking`` not kept yet, within ``top`` kept in all (None: no limit), each at int8 (``keep="int8"``) or in
    float; an ``abnormal`` layer goes to float (the outliers that ruined its int4 group scales ruin its int8
    per-channel scales as much), one already at int8 too (its int8 op is abnormal: a layer stays kept, moved up, not
    counted in ``width``). None when nothing changes."""
    moved = [p for p in int8 if p in abnormal]
    int8, flt = [p for p in int8 if p not in moved], list(flt) + moved
    added = 0
    for p in ranking:
        if (width is not None and added == width) or (top is not None and len(int8) + len(flt) >= top):
            break
        if p in flt or p in int8:
            continue
        (flt if p in abnormal or keep == "float" else int8).append(p)
        added += 1
    return (int8, flt) if added or moved else None


def _options(options: dict[str, Any], int8: list[str], flt: list[str]) -> dict[str, Any]:
    out = dict(options)
    out["int8_module_paths"] = tuple(out.get("int8_module_paths", ())) + tuple(int8)
    out["exclude_module_paths"] = tuple(out.get("exclude_module_paths", ())) + tuple(flt)
    return out


def _step(model: torch.nn.Module, prompt: torch.Tensor, ref: tuple[list[int], torch.Tensor], recipe_type: Any,
          options: dict[str, Any], export_args: tuple, reexport: int, int8: list[str], flt: list[str],
          rank: int) -> GenerationStep:
    et = _export(model, recipe_type, _options(options, int8, flt), export_args, etrecord=bool(rank))
    agree, near, sqnr, ms = _measure(et.buffer, prompt, *ref)
    step = GenerationStep(reexport, list(int8), list(flt), agree, len(ref[0]), sqnr, len(et.buffer), ms,
                          near_tie_agreement=near)
    if rank and not step.restored:
        step.ranking, step.own_sqnr_db, step.abnormal = rank_layers(et, model, prompt, ref[0][:rank])
        step.local_ranking = list(step.own_sqnr_db)
    return step


def _check(recipe_type: Any, tokens: Any, max_reexports: Any, keep: str, prompt: Any) -> None:
    from edgetorch.export.recipes_torchao import TORCHAO_RECIPES

    if getattr(recipe_type, "name", None) not in TORCHAO_RECIPES:
        raise RecipeError(f"find_generation_fix: {recipe_type!r} is not a torchao low-bit recipe (one of "
                          f"{sorted(TORCHAO_RECIPES)} on PortableRecipeType / OrtRecipeType)")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise InspectorError(f"find_generation_fix: tokens must be a positive int, got {tokens!r}")
    if isinstance(max_reexports, bool) or not isinstance(max_reexports, int) or max_reexports < 1:
        raise InspectorError(f"find_generation_fix: max_reexports must be a positive int, got {max_reexports!r}")
    if keep not in ("int8", "float"):
        raise InspectorError(f"find_generation_fix: keep must be 'int8' or 'float', got {keep!r}")
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] < 1:
        raise InspectorError(f"find_generation_fix: prompt must be a (1, T) tensor of token ids, got "
                             f"{getattr(prompt, 'shape', type(prompt).__name__)}")


def find_generation_fix(model: torch.nn.Module, prompt: torch.Tensor, recipe_type: Any, tokens: int = 32,
                        max_reexports: int = 4, keep: str = "int8", top: int | None = None, rank_tokens: int = 8,
                        method_inputs: dict[str, tuple] | None = None, dynamic_shapes: Any = None,
                        progress: Callable[[str], None] | None = None,
                        **recipe_options: Any) -> GenerationFixResult:
    """Finds and proves the layers to keep at int8 (or float) so that the low-bit program of ``recipe_type``
    greedily generates the float model's ``tokens`` tokens from ``prompt`` (see the module docstring): at most
    ``max_reexports`` exports, at most ``top`` layers kept (None: any number). ``recipe_options`` go to the recipe
    (``group_size=``, ...; the layers the caller already keeps stay kept)."""
    _check(recipe_type, tokens, max_reexports, keep, prompt)
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise InspectorError(f"find_generation_fix: top must be a positive int or None, got {top!r}")
    say = progress or (lambda msg: log.info("%s", msg))
    export_args = (method_inputs, dynamic_shapes, False) if method_inputs is not None else llm_export_args(model)
    model = model.eval()
    ref = _float_reference(model, prompt, tokens)
    name = str(getattr(recipe_type, "value", recipe_type))
    result = GenerationFixResult(name, tokens, keep, [], list(ref[0]), _margin(ref[1]))
    rank = max(1, min(tokens, rank_tokens))
    base = _step(model, prompt, ref, recipe_type, recipe_options, export_args, 0, [], [], rank=rank)
    result.steps.append(base)
    say(f"baseline: {base.agreement}/{tokens} tokens agree with the float model, logits SQNR "
        f"{base.logits_sqnr_db:.1f} dB, {base.size_bytes} bytes, decode {base.decode_ms:.3f} ms/token; most "
        f"responsible: {', '.join(base.ranking[:3]) or '-'}")
    int8: list[str] = []
    flt: list[str] = []
    while not result.steps[-1].restored and result.reexports < max_reexports:
        n = result.reexports + 1
        src = result.best  # the best program so far: its ranking names the next layers to keep
        last = n == max_reexports
        width = None if last and n > 1 else (max(1, len(base.abnormal)) if n == 1 else 2 ** (n - 1))
        abnormal = list(dict.fromkeys(base.abnormal + src.abnormal))
        kept = _next_kept(src.ranking or base.ranking, int8, flt, keep, width, top, abnormal)
        if kept is None:
            say(f"no layer left to keep (top={top})")
            break
        int8, flt = kept
        step = _step(model, prompt, ref, recipe_type, recipe_options, export_args, n, int8, flt,
                     rank=0 if last else rank)
        result.steps.append(step)
        say(f"re-export {n}: int8 {', '.join(int8) or '-'}; float {', '.join(flt) or '-'} -> {step.agreement}/"
            f"{tokens} tokens ({step.near_tie_agreement} counting the float model's near ties), logits SQNR "
            f"{step.logits_sqnr_db:.1f} dB, {step.size_bytes} bytes, decode {step.decode_ms:.3f} ms/token")
    return result
