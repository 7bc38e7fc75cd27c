"""``attn-companion``: build the book, re-run one notebook, or sweep a notebook over parameters.

    attn-companion book [-p NAME VALUE ...] [--params "NAME=VALUE ..."]   execute every notebook, build _build/html
    attn-companion run NOTEBOOK [-p NAME VALUE ...]         execute one notebook into runs/
    attn-companion sweep NOTEBOOK -p NAME v1,v2 ... [--jobs K]   every combination, in parallel
    attn-companion params [NOTEBOOK]                        list the parameters and what they accept
    attn-companion student --out DIR [NOTEBOOK ...] [-p NAME VALUE ...]   student copies of the exercises
    attn-companion grade SUBMISSION ... [--out grades.csv] [--time-limit S] [-p NAME VALUE ...]
    attn-companion corpus [--refresh]                       check the shipped War and Peace (or download it again)
"""
from __future__ import annotations

import argparse
import ast
import os
import shlex
import signal
import sys
from pathlib import Path

from attn_utils.book import build, sweep

from attn_utils.classroom import grading, student
from attn_utils.book.params import SPECS


def _parameters(pairs: list[list[str]] | None, *, multi: bool = False) -> dict:
    params = {}
    for name, value in pairs or []:
        params[name] = build.split_values(value) if multi else build.parse_value(value)
    return params


QUOTING = ("PARAMS is split at spaces, so write a value without spaces or quote it: "
           "PARAMS='Ts=[1,2]' or PARAMS=\"Ts='[1, 2]'\"")


def _params_line(text: str) -> dict:
    """The ``NAME=VALUE`` items of ``--params`` (``make book PARAMS=...``), split like a shell line."""
    try:
        items = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"--params {text!r}: {exc}. {QUOTING}") from None
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not (sep and name.isidentifier() and _complete(value)):
            raise ValueError(f"--params: cannot read {item!r} as NAME=VALUE. {QUOTING}")
        params[name] = build.parse_value(value)
    return params


def _complete(value: str) -> bool:
    """False for a list, tuple or dict cut short, as ``Ts=[1,`` from ``PARAMS="Ts=[1, 2]"``."""
    if value[:1] not in "[({":
        return True
    try:
        ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return False
    return True


def _check_out(path: Path) -> None:
    """Refuse an output folder that cannot be created or written to (nothing is created)."""
    full = path.resolve()
    existing = next(p for p in (full, *full.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: {existing} is not writable")


def _announce_model(parameters: dict, notebooks: list[Path]) -> None:
    """One line on the terminal saying which model ``model='auto'`` takes and why, before anything runs."""
    declared = [build.notebook_parameters(nb).get("model") for nb in notebooks]
    if parameters.get("model", next((m for m in declared if m is not None), None)) != "auto":
        return
    from attn_utils.models.loading import choose_auto

    name, why = choose_auto()
    print(f"model 'auto' -> {name}: {why}", flush=True)


def _corpus(refresh: bool) -> str:
    from attn_utils.models import corpus

    if refresh:
        corpus.refresh_war_and_peace()
    text = corpus.load_text()
    return (f"{text.name}: {text.source}, sha256 {text.sha256} (pinned), {text.n_chapters} chapters"
            + (" (downloaded again)" if refresh else ""))


def _print_params(notebook: str | None) -> None:
    sources = [build.resolve_notebook(notebook)] if notebook else sorted(build.NOTEBOOK_DIR.glob("*.py"))
    for src in sources:
        print(f"{src.stem}:")
        for name, default in build.notebook_parameters(src).items():
            spec = SPECS.get(name)
            print(f"  {name} = {default!r}    # {spec.doc if spec else ''}; allowed: {spec.allowed if spec else '?'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attn-companion", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_book = sub.add_parser("book", help="execute every notebook and build the HTML book")
    p_book.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    p_book.add_argument("--params", default="", metavar="'NAME=VALUE ...'",
                        help="parameters in one string, split like a shell line (make book PARAMS=...)")
    p_book.add_argument("--out", type=Path, default=build.ROOT / "_build" / "html",
                        help="HTML folder (default _build/html)")
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
    p_corpus = sub.add_parser("corpus", help="check the shipped War and Peace against its pinned sha256")
    p_corpus.add_argument("--refresh", action="store_true",
                          help="download pg2600.txt from Project Gutenberg and rewrite the shipped copy if its "
                               "sha256 is the pinned one")
    args = parser.parse_args(argv)

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
    try:
        if args.command in ("book", "run", "sweep"):
            _check_out(args.out)
        if args.command == "book":
            parameters = {**_params_line(args.params), **_parameters(args.parameter)}
            _announce_model(parameters, build.book_notebooks())
            result = build.build_book(parameters, out=args.out)
            print(f"book written to {result.html / 'index.html'}")
        elif args.command == "run":
            src = build.resolve_notebook(args.notebook)
            _announce_model(_parameters(args.parameter), [src])
            out = sweep.run_one(src, _parameters(args.parameter), args.out)
            print(f"executed notebook: {out}")
        elif args.command == "sweep":
            src = build.resolve_notebook(args.notebook)
            index = sweep.sweep(src, _parameters(args.parameter, multi=True), args.out, jobs=args.jobs)
            print(f"sweep index: {index}")
        elif args.command == "student":
            written = student.student_copies(args.out, args.notebooks, _parameters(args.parameter))
            print(f"{len(written)} student copies written to {args.out}")
        elif args.command == "corpus":
            print(_corpus(args.refresh))
        elif args.command == "grade":
            grading.grade(args.submissions, args.out, time_limit=args.time_limit,
                            parameters=_parameters(args.parameter))
        else:
            _print_params(args.notebook)
    except (ValueError, build.NotebookFailed, RuntimeError) as exc:
        print(f"attn-companion {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        kept = f"; the previous book in {args.out} is kept" if args.command == "book" else ""
        print(f"\nattn-companion {args.command}: interrupted{kept}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
