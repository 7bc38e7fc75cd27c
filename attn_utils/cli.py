"""``attn-companion``: build the book, re-run one notebook, or sweep a notebook over parameters.

    attn-companion book [-p NAME VALUE ...]                 execute every notebook, build _build/html
    attn-companion run NOTEBOOK [-p NAME VALUE ...]         execute one notebook into runs/
    attn-companion sweep NOTEBOOK -p NAME v1,v2 ... [--jobs K]   every combination, in parallel
    attn-companion params [NOTEBOOK]                        list the parameters and what they accept
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import execute, sweep
from .params import SPECS


def _parameters(pairs: list[list[str]] | None, *, multi: bool = False) -> dict:
    params = {}
    for name, value in pairs or []:
        params[name] = execute.split_values(value) if multi else execute.parse_value(value)
    return params


def _print_params(notebook: str | None) -> None:
    sources = [execute.resolve_notebook(notebook)] if notebook else sorted(execute.NOTEBOOK_DIR.glob("*.py"))
    for src in sources:
        print(f"{src.stem}:")
        for name, default in execute.notebook_parameters(src).items():
            spec = SPECS.get(name)
            print(f"  {name} = {default!r}    # {spec.doc if spec else ''}; allowed: {spec.allowed if spec else '?'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attn-companion", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_book = sub.add_parser("book", help="execute every notebook and build the HTML book")
    p_book.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    p_book.add_argument("--out", type=Path, default=None, help="HTML folder (default _build/html)")
    p_run = sub.add_parser("run", help="execute one notebook with parameters")
    p_run.add_argument("notebook")
    p_run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    p_run.add_argument("--out", type=Path, default=Path("runs"), help="output folder (default runs/)")
    p_sweep = sub.add_parser("sweep", help="execute one notebook over every combination of parameter values")
    p_sweep.add_argument("notebook")
    p_sweep.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "V1,V2,..."))
    p_sweep.add_argument("--jobs", type=int, default=1, help="notebooks executed at once (default 1)")
    p_sweep.add_argument("--out", type=Path, default=Path("runs"), help="output folder (default runs/)")
    p_params = sub.add_parser("params", help="list the notebooks' parameters")
    p_params.add_argument("notebook", nargs="?")
    args = parser.parse_args(argv)

    try:
        if args.command == "book":
            result = execute.build_book(_parameters(args.parameter), out=args.out)
            print(f"book written to {result.html / 'index.html'}")
        elif args.command == "run":
            src = execute.resolve_notebook(args.notebook)
            out = sweep.run_one(src, _parameters(args.parameter), args.out)
            print(f"executed notebook: {out}")
        elif args.command == "sweep":
            src = execute.resolve_notebook(args.notebook)
            index = sweep.sweep(src, _parameters(args.parameter, multi=True), args.out, jobs=args.jobs)
            print(f"sweep index: {index}")
        else:
            _print_params(args.notebook)
    except (ValueError, execute.NotebookFailed, RuntimeError) as exc:
        print(f"attn-companion {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
