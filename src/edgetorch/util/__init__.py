"""Utilities over compiled programs, where the reference's users import them from (``executorch.util``):
``util.activation_memory_profiler.generate_memory_trace`` draws a method's memory plan as a Chrome trace."""
__all__: list[str] = []
