"""How ``to_executorch`` bounds dynamic shapes for memory planning, where the reference's users import it from
(``exir.passes.sym_shape_eval_pass``): give one to ``ExecutorchBackendConfig(sym_shape_eval_pass=...)``."""

from edgetorch.exir.symbolic import ConstraintBasedSymShapeEvalPass, HintBasedSymShapeEvalPass, SymShapeEvalPass

__all__ = ["ConstraintBasedSymShapeEvalPass", "HintBasedSymShapeEvalPass", "SymShapeEvalPass"]
