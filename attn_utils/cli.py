"""``attn-companion``: build the book, re-run one notebook, or sweep a notebook over parameters.

    attn-companion book [-p NAME VALUE ...]                 execute every notebook, build _build/html
    attn-companion run NOTEBOOK [-p NAME VALUE ...]         execute one notebook into runs/
    attn-companion sweep NOTEBOOK -p NAME v1,v2 ... [--jobs K]   every combination, in parallel
    attn-companion params [NOTEBOOK]                        list the parameters and what they accept
    attn-companion student --out DIR [NOTEBOOK ...] [-p NAME VALUE ...]   student copies of the exercises
    attn-companion grade SUBMISSION ... [--out grades.csv] [--time-limit S] [-p NAME VALUE ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import execute, grading, student, sweep
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
    p_student = sub.add_parser("student", help="write student copies: solutions replaced by stubs")
    p_student.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="default: every notebook with exercises")
    p_student.add_argument("--out", type=Path, required=True, help="folder of the student copies")
    p_student.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                           help="a default written into the copies (e.g. -p model gpt2-random)")
    p_grade = sub.add_parser("grade", help="execute submitted notebooks and grade their exercises")
    p_grade.add_argument("submissions", nargs="+", type=Path, metavar="SUBMISSION")
    p_grade.add_argument("--out", type=Path, default=Path("grades.csv"), help="grades CSV (default grades.csv)")
    p_grade.add_argument("--time-limit", type=float, default=600.0,
                         help="seconds one submission may run before it is stopped (default 600)")
    p_grade.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
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
        elif args.command == "student":
            written = student.student_copies(args.out, args.notebooks, _parameters(args.parameter))
            print(f"{len(written)} student copies written to {args.out}")
        elif args.command == "grade":
            grading.grade(args.submissions, args.out, time_limit=args.time_limit,
                            parameters=_parameters(args.parameter))
        else:
            _print_params(args.notebook)
    except (ValueError, execute.NotebookFailed, RuntimeError) as exc:
        print(f"attn-companion {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
