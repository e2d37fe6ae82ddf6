"""The package version, at the bottom of the import graph (the ETRecord writer records it)."""

__version__ = "0.1.0"
