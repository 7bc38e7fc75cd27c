"""``attn-companion``: build the book, re-run one notebook, or sweep a notebook over parameters.

    attn-companion book [-p NAME VALUE ...] [--params "NAME=VALUE ..."] [--no-cache]
                                                            execute every notebook, build _build/html
    attn-companion run NOTEBOOK [-p NAME VALUE ...] [--no-cache]   execute one notebook into runs/
    attn-companion sweep NOTEBOOK -p NAME v1,v2 ... [--workers K | --scheduler ADDRESS] [--force]
                                                            every combination, on a Dask cluster; a table and an index
    attn-companion windows [--windows K] [--notebooks NB ...] [-p NAME VALUE ...] [--workers N | --scheduler ADDRESS]
                                                            the model chapters on K windows across the novel: verdicts
                                                            and their spread (windows.json; book --windows FILE)
    attn-companion params [NOTEBOOK]                        list the parameters and what they accept
    attn-companion student --out COURSE [NOTEBOOK ...] [-p NAME VALUE ...] [--time-limit S] [--exercises-only]
                                                            an nbgrader course of the exercises
    attn-companion grade --course COURSE [SUBMISSION ...] [--out grades.csv] [--time-limit S] [--no-sandbox]
                                                            grade with nbgrader, each kernel in a sandbox
    attn-companion corpus [--refresh]                       check the shipped War and Peace (or download it again)

Before any notebook runs, every command that runs or writes notebooks checks each notebook's parameters with its
defaults filled in, the rules between them, the model's context and the corpus (attn_utils.book.build.preflight).
A notebook whose execution the cache holds under the same key (its code, parameters, the library's source, the
installed versions, the model's weights, the corpus, the device and the seed) is not executed again; --no-cache
executes it (attn_utils.book.cache).
"""
from __future__ import annotations

import argparse
import ast
import os
import shlex
import signal
import sys
from pathlib import Path

from attn_utils.book import build, sweep, windows

from attn_utils.book.params import describe
from attn_utils.classroom import exercises, grading, nbgrader_support, student


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
        return not isinstance(build.parse_value(value), str)  # a bracketed list of bare words is complete
    return True


def _check_out(path: Path) -> None:
    """Refuse an output folder that cannot be created or written to (nothing is created)."""
    full = path.resolve()
    existing = next(p for p in (full, *full.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: {existing} is not writable")


def _preflight_exercises(notebooks: list[str], parameters: dict) -> None:
    """:func:`attn_utils.book.build.preflight` for the chapters of a course (``notebooks``, default: every one with
    an exercise) with ``parameters``, the values their read-only parameters cells will hold."""
    stems = [build.resolve_notebook(n).stem for n in notebooks] or exercises.exercise_notebooks()
    own = student.per_notebook(parameters, stems)
    build.preflight([(build.NOTEBOOK_DIR / f"{stem}.py", own[stem]) for stem in stems])


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
        defaults = build.notebook_parameters(src)
        print(f"{src.stem}:" + ("" if defaults else " no parameters"))
        if defaults:
            print(describe(defaults))
    print("A value passed with -p replaces the default; every value and rule is checked before any notebook runs.")


def _cache_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--no-cache", dest="reuse", action="store_false",
                         help="execute every notebook, even those whose execution the cache (_build/cache) holds "
                              "under the same key; the new executions replace the cached ones")


def _cluster_options(command: argparse.ArgumentParser) -> None:
    """``--workers`` and ``--scheduler`` of the commands that run on Dask (checked by ``sweep.Cluster``)."""
    command.add_argument("--workers", dest="workers", type=int, default=None, metavar="K",
                         help="worker processes of the local cluster, one thread each (default min(2, cores))")
    command.add_argument("--scheduler", default=None, metavar="ADDRESS",
                         help="the address of a running Dask scheduler (tcp://HOST:8786) to send the tasks to, "
                              "instead of a local cluster")


def parser() -> argparse.ArgumentParser:
    """The command line of ``attn-companion``."""
    parser = argparse.ArgumentParser(prog="attn-companion", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_book = sub.add_parser("book", help="execute every notebook and build the HTML book")
    p_book.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    p_book.add_argument("--params", default="", metavar="'NAME=VALUE ...'",
                        help="parameters in one string, split like a shell line (make book PARAMS=...)")
    p_book.add_argument("--out", type=Path, default=build.ROOT / "_build" / "html",
                        help="HTML folder (default _build/html)")
    p_book.add_argument("--repository", default=None, metavar="https://github.com/OWNER/NAME",
                        help="the public repository: turns on the repository, Binder and Colab buttons "
                             "(default $ATTN_COMPANION_REPOSITORY; without it they are not shown)")
    p_book.add_argument("--windows", type=Path, default=None, metavar="WINDOWS_JSON",
                        help="the windows.json of `attn-companion windows`: the ledger then shows whether each model "
                             "claim's verdict is stable across its K windows (default: one window, no such column)")
    _cache_option(p_book)
    p_run = sub.add_parser("run", help="execute one notebook with parameters")
    p_run.add_argument("notebook")
    p_run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    p_run.add_argument("--out", type=Path, default=Path("runs"), help="output folder (default runs/)")
    _cache_option(p_run)
    p_sweep = sub.add_parser("sweep", help="execute one notebook over every combination of parameter values, one Dask "
                                           "task per combination",
                             description="Execute NOTEBOOK for every combination of the values given with -p, one "
                                         "dask.distributed task per combination: on a local cluster of worker "
                                         "processes, or on the running cluster of --scheduler. Each result is "
                                         "written to OUT/NOTEBOOK/<combination>/ as it arrives; a combination whose "
                                         "folder says ok is skipped. OUT/NOTEBOOK/ gets results.parquet and "
                                         "results.csv (one row per combination and ledger claim) and index.html "
                                         "(the verdicts and the headline numbers compared).")
    p_sweep.add_argument("notebook")
    p_sweep.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "V1,V2,..."),
                         help="a parameter and its values, separated by commas (repeat for more parameters)")
    _cluster_options(p_sweep)
    _cache_option(p_sweep)
    p_sweep.add_argument("--force", action="store_true",
                         help="run again the combinations that already finished (default: skip them)")
    p_sweep.add_argument("--out", type=Path, default=Path("runs"), help="output folder (default runs/)")
    p_windows = sub.add_parser(
        "windows", help="the model chapters on K windows spread across the novel: each claim's verdict per window, "
                        "whether it is stable, the spread of its numbers",
        description="Execute the model chapters on K windows of the novel: window k starts at the first token of "
                    "chapter c_k = 1 + floor(k * 365 / K) (chapters = [c_k, 365], offset 0), one Dask sweep per "
                    "chapter into OUT/NOTEBOOK/ (finished runs are skipped). The synthetic checks, the same in every "
                    "window, run at a tenth of their default sizes unless -p says otherwise. OUT/windows.json and "
                    "windows.csv then give, per ledger claim, the verdict in each window, whether it is stable, and "
                    "the median, min and max of each number; `attn-companion book --windows OUT/windows.json` shows "
                    "them in the ledger.")
    p_windows.add_argument("--windows", dest="k", type=int, default=windows.DEFAULT_K, metavar="K",
                           help=f"number of windows (default {windows.DEFAULT_K}; at most the corpus's chapters)")
    p_windows.add_argument("--notebooks", nargs="+", default=list(windows.MODEL_CHAPTERS), metavar="NOTEBOOK",
                           help=f"the chapters to run (default {' '.join(windows.MODEL_CHAPTERS)}; also "
                                f"{' '.join(windows.OPTIONAL_CHAPTERS)})")
    p_windows.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                           help="a parameter for every chapter that has it (not chapters or offset, set per window)")
    _cluster_options(p_windows)
    _cache_option(p_windows)
    p_windows.add_argument("--force", action="store_true", help="run again the windows that already finished")
    p_windows.add_argument("--out", type=Path, default=Path("runs") / "windows",
                           help="output folder (default runs/windows)")
    p_params = sub.add_parser("params", help="list the notebooks' parameters, what they accept, the rules between them")
    p_params.add_argument("notebook", nargs="?")
    p_student = sub.add_parser("student", help="write an nbgrader course of the exercises: source/ with solutions "
                                               "and hidden tests, release/ for the students")
    p_student.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="default: every notebook with exercises")
    p_student.add_argument("--out", type=Path, required=True, help="the course folder (new, or one written before)")
    p_student.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                           help="a default written into the notebooks (e.g. -p model gpt2-random)")
    p_student.add_argument("--time-limit", type=float, default=student.DEFAULT_TIME_LIMIT,
                           help=f"seconds one cell may run when it is graded (default {student.DEFAULT_TIME_LIMIT:g}; "
                                f"the chapter's read-only cells get at least 600)")
    p_student.add_argument("--exercises-only", action="store_true",
                           help="notebooks with the chapters' exercises only (no model: graded in seconds)")
    p_grade = sub.add_parser("grade", help="grade submitted notebooks with nbgrader (autograde, feedback, export)")
    p_grade.add_argument("--course", type=Path, required=True, help="the course folder written by `student`")
    p_grade.add_argument("submissions", nargs="*", type=Path, metavar="SUBMISSION",
                         help="submitted files, in folders named after the students (default: what nbgrader "
                              "collect put in the course's submitted/)")
    p_grade.add_argument("--out", type=Path, default=Path("grades.csv"), help="grades CSV (default grades.csv)")
    p_grade.add_argument("--time-limit", type=float, default=None,
                         help="seconds one cell may run (default: the course's, from nbgrader_config.py)")
    p_grade.add_argument("--no-sandbox", dest="sandboxed", action="store_false",
                         help="run the kernels without the sandbox, with your permissions (where the machine allows "
                              "no sandbox: grade in a throw-away container then)")
    p_corpus = sub.add_parser("corpus", help="check the shipped War and Peace against its pinned sha256")
    p_corpus.add_argument("--refresh", action="store_true",
                          help="download pg2600.txt from Project Gutenberg and rewrite the shipped copy if its "
                               "sha256 is the pinned one")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
    try:
        if args.command in ("book", "run", "sweep", "windows"):
            _check_out(args.out)
        if args.command == "book":
            parameters = {**_params_line(args.params), **_parameters(args.parameter)}
            across = windows.load(args.windows) if args.windows is not None else None
            result = build.build_book(parameters, out=args.out, repository=args.repository, windows=across,
                                      reuse=args.reuse)
            print(f"book written to {result.html / 'index.html'}")
        elif args.command == "run":
            src = build.resolve_notebook(args.notebook)
            out = sweep.run_one(src, _parameters(args.parameter), args.out, reuse=args.reuse)
            print(f"executed notebook: {out}")
        elif args.command == "sweep":
            src = build.resolve_notebook(args.notebook)
            index = sweep.sweep(src, _parameters(args.parameter, multi=True), args.out,
                                cluster=sweep.Cluster(args.workers, args.scheduler), force=args.force,
                                reuse=args.reuse)
            print(f"sweep index: {index}\ntable: {index.parent / 'results.parquet'} (and results.csv)")
        elif args.command == "windows":
            path = windows.run_windows(args.k, args.out, notebooks=args.notebooks,
                                       parameters=_parameters(args.parameter),
                                       cluster=sweep.Cluster(args.workers, args.scheduler), force=args.force,
                                reuse=args.reuse)
            print(f"windows: {path} (and windows.csv); build the book with it: attn-companion book --windows {path}")
        elif args.command == "student":
            nbgrader_support.check_time_limit(args.time_limit)
            if not args.exercises_only:  # notebooks of exercises only run no chapter code
                _preflight_exercises(args.notebooks, _parameters(args.parameter))
            released = student.write_course(args.out, args.notebooks, _parameters(args.parameter),
                                            time_limit=args.time_limit, exercises_only=args.exercises_only)
            print(f"nbgrader course written to {args.out}: {len(released)} assignment(s); hand out "
                  f"{args.out / 'release'}, keep {args.out / 'source'} (solutions, hidden tests)")
        elif args.command == "corpus":
            print(_corpus(args.refresh))
        elif args.command == "grade":
            grading.grade(args.course, args.submissions or None, args.out, time_limit=args.time_limit,
                          sandboxed=args.sandboxed)
        else:
            _print_params(args.notebook)
    except (ValueError, build.NotebookFailed, RuntimeError) as exc:
        print(f"attn-companion {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        kept = {"book": f"; the previous book in {args.out} is kept",
                "sweep": f"; the finished runs in {args.out} are kept (a re-run skips them)",
                "windows": f"; the finished runs in {args.out} are kept (a re-run skips them)"}.get(args.command, "")
        print(f"\nattn-companion {args.command}: interrupted{kept}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
