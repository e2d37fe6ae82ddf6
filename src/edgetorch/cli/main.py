"""Entry point of the ``edgetorch`` console script: dispatches to the sub-commands.

Sub-commands import what they need lazily, so ``edgetorch run`` starts without loading the compiler.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

__all__ = ["main"]

_COMMANDS = {
    "demo": ("edgetorch.cli.demo", "Export a zoo model, run it with ETDump, print its numeric-gap table and "
             "write an HTML report"),
    "run": ("edgetorch.cli.run", "Run a .pte or bundled program (.bpte), verify outputs, dump intermediates"),
    "inspect": ("edgetorch.cli.inspect", "Print the profile or numeric-gap table of an ETDump + ETRecord"),
    "fix": ("edgetorch.cli.fix", "Find the smallest set of ops to keep in float or off the delegate that brings "
            "a model's final output within tolerance; re-export and prove it"),
    "generate": ("edgetorch.cli.generate", "Export a zoo LLM as prefill + decode, generate tokens on the runtime "
                 "and compare them with eager PyTorch"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgetorch", description="edgetorch: run models op by op and find "
                                     "where their numbers drift")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress of the library")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in _COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        mod.add_arguments(p)
        modules[name] = mod
    args = parser.parse_args(argv)
    if args.verbose:  # third-party messages too (edgetorch._quiet)
        from edgetorch import _quiet

        _quiet.set_quiet(False)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.command not in modules:
        parser.error(f"command '{args.command}' is not available in this installation")
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
