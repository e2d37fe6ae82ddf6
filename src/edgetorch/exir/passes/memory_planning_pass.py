"""``MemoryPlanningPass``, where the reference's users import it from (``exir.passes.memory_planning_pass``)."""

from edgetorch.exir.memory_planning import MemoryPlanningPass

__all__ = ["MemoryPlanningPass"]
