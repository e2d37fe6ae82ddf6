"""``CompileSpec`` where the reference's users import it from (``exir.backend.compile_spec_schema``): a key and
bytes value a partitioner hands its backend's ``preprocess``. Defined in ``exir.backend.partitioner``."""

from edgetorch.exir.backend.partitioner import CompileSpec

__all__ = ["CompileSpec"]
