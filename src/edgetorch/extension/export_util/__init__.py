"""``edgetorch.extension.export_util.utils``: the reference's one-call export helpers."""

__all__: list[str] = []
