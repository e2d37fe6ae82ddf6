"""``edgetorch inspect --gap --reference-graph float [--float-model NAME]``: a low-bit generation recorded with
``generate --recipe ... --etdump`` against the float model it was quantized from, per token and per quantized layer
(``devtools.inspector.quantized_generation``): the float program its ETRecord holds (a torchao-recipe export records
it), or with ``--float-model`` the zoo model rebuilt by name (seeded weights)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["print_quantized_generation", "write_quantized_generation_report"]


def _db(v: float) -> str:
    return "-" if v != v else ("inf" if math.isinf(v) and v > 0 else f"{v:.1f}")


def print_quantized_generation(inspector: Any, model_name: str | None, console: Any, impact: bool = False) -> Any:
    """Prints the per-token summary and the worst layers (with ``impact``: their mean share of the logit error);
    returns the table (token x layer, long form)."""
    from edgetorch.cli._common import CliError
    from edgetorch.devtools.inspector.quantized_generation import quantized_generation_table
    from edgetorch.errors import EdgeTorchError
    from edgetorch.models import get_spec

    model = None
    try:
        if model_name is not None:
            model = get_spec(model_name).build().eval()
    except (KeyError, ValueError, EdgeTorchError) as e:
        raise CliError(f"--float-model {model_name!r}: {e}") from None
    try:
        df = quantized_generation_table(inspector, model, impact=impact)
    except EdgeTorchError as e:
        raise CliError(str(e)) from None

    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False)

    which = model_name if model_name is not None else "(the ETRecord's float program)"
    say(f"quantized generation against the float model {which} (teacher-forced on the runtime's inputs)")
    per_token = df.groupby("execution", sort=True)
    for t in df.attrs["tokens"].itertuples():
        rows = per_token.get_group(t.execution)
        worst = rows.loc[rows["local_sqnr_db"].fillna(math.inf).idxmin()]
        mark = "" if t.runtime_token == t.float_token else "  <- greedy choice differs"
        say(f"  call {t.execution:>3} {t.method:<8} token {t.runtime_token} (float {t.float_token}), logits SQNR "
            f"{_db(t.logits_sqnr_db)} dB, worst layer {worst['layer']} (local {_db(worst['local_sqnr_db'])} dB, "
            f"accumulated {_db(worst['sqnr_db'])} dB){mark}")
    first = df.attrs["first_divergence"]
    say("greedy tokens agree with the float model" if first is None else
        f"first token whose greedy choice differs from the float model's: call {first}")
    say(f"layer most responsible: {df.attrs['responsible_layer']}")
    say("layers whose own quantization error is abnormal: " + (", ".join(df.attrs.get("abnormal", [])) or "none"))
    say("layers by mean own SQNR (the layer's low-bit op on the float model's input; worst first): " + ", ".join(
        f"{name} {_db(v)} dB" for name, v in df.attrs["ranking"].head(5).items()))
    if impact:
        shares = df.groupby("layer", sort=False)["logit_share"].mean().sort_values(ascending=False)
        say("layers by mean share of the logit error (their own error alone, injected into the float model): "
            + ", ".join(f"{name} {v:.1%}" for name, v in shares.head(5).items()))
    return df


def write_quantized_generation_report(path: str, inspector: Any, df: Any, etdump: str, console: Any) -> None:
    """The HTML report led by the per-token x per-layer heat maps (then the profile)."""
    import os

    from edgetorch.cli._common import CliError
    from edgetorch.devtools.report import write_report

    summary = {"ETDump": etdump, "reference": "the float model (teacher-forced on the runtime's inputs)",
               "calls": len(df.attrs["tokens"])}
    try:
        write_report(path, None, inspector.to_dataframe(), summary=summary,
                     title=f"edgetorch inspect: {os.path.basename(etdump)}", quant_generation_df=df)
    except OSError as e:
        raise CliError(f"cannot write output: {e.strerror or e}: {e.filename or ''}") from None
    console.print(f"report written to {path}", highlight=False, markup=False)
