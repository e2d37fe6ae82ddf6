"""Operator namespaces for writing passes and partitioners (``dialects._ops.ops``), as the reference spells them."""

__all__: list[str] = []
