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

The arguments and every parameter's specification are checked with light imports only (attn_utils.book.sources),
so that a typo is refused at once; torch, transformers and the notebook stack are imported after that.
"""
from __future__ import annotations

import argparse
import ast
import os
import shlex
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

from attn_utils.book import sources
from attn_utils.book.params import describe
from attn_utils.classroom.limits import DEFAULT_TIME_LIMIT, check_time_limit


def _parameters(pairs: list[list[str]] | None, *, multi: bool = False) -> dict:
    params = {}
    for name, value in pairs or []:
        params[name] = sources.split_values(value) if multi else sources.parse_value(value)
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
        params[name] = sources.parse_value(value)
    return params


def _complete(value: str) -> bool:
    """False for a list, tuple or dict cut short, as ``Ts=[1,`` from ``PARAMS="Ts=[1, 2]"``."""
    if value[:1] not in "[({":
        return True
    try:
        ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return not isinstance(sources.parse_value(value), str)  # a bracketed list of bare words is complete
    return True


def _check_out(path: Path) -> None:
    """Refuse an output folder that cannot be created or written to (nothing is created)."""
    full = path.resolve()
    existing = next(p for p in (full, *full.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {path}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {path}: {existing} is not writable")


def _check_book(parameters: dict) -> None:
    """The specification of every book notebook's values (:func:`attn_utils.book.sources.check_specs`), before the
    build imports anything heavy, and the build's ``models`` (unless ``auto``, which the build resolves); a parameter
    no notebook declares is left to the build to name."""
    if parameters.get("models", "auto") != "auto" or "models" in parameters and "model" in parameters:
        from attn_utils.book.params import book_models

        book_models(parameters["models"], model=parameters.get("model"))
    for src in sources.book_notebooks():
        declared = sources.notebook_parameters(src)
        if declared:
            sources.check_specs(src, {k: v for k, v in parameters.items() if k in declared})


def _preflight_exercises(notebooks: list[str], parameters: dict, exercises_only: bool) -> None:
    """:func:`attn_utils.book.build.preflight` for the chapters of a course (``notebooks``, default: every one with
    an exercise) with ``parameters``, the values their read-only parameters cells will hold. With
    ``exercises_only`` no chapter code runs: only a ``model`` given is checked (that it names a model)."""
    from attn_utils.book import build
    from attn_utils.classroom import exercises, student

    if exercises_only:
        if "model" in parameters and parameters["model"] != "auto":
            from attn_utils.models.loading import model_context

            try:
                model_context(parameters["model"])
            except (OSError, ValueError) as err:
                raise ValueError(f"-p model {parameters['model']!r}: {str(err).splitlines()[0]}") from None
        return
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
    found = [sources.resolve_notebook(notebook)] if notebook else sorted(sources.NOTEBOOK_DIR.glob("*.py"))
    for src in found:
        defaults = sources.notebook_parameters(src)
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
    p_book.add_argument("--out", type=Path, default=sources.ROOT / "_build" / "html",
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
    p_windows.add_argument("--windows", dest="k", type=int, default=sources.DEFAULT_K, metavar="K",
                           help=f"number of windows (default {sources.DEFAULT_K}; at most the corpus's chapters)")
    p_windows.add_argument("--notebooks", nargs="+", default=list(sources.MODEL_CHAPTERS), metavar="NOTEBOOK",
                           help=f"the chapters to run (default {' '.join(sources.MODEL_CHAPTERS)}; also "
                                f"{' '.join(sources.OPTIONAL_CHAPTERS)})")
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
    p_student.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT,
                           help=f"seconds one cell may run when it is graded (default {DEFAULT_TIME_LIMIT:g}; "
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


class _Interrupted:
    """Ctrl-C (SIGINT) and SIGTERM raise ``KeyboardInterrupt`` here and are remembered: whatever fails after one
    (the kernel's cell, which got the same SIGINT, may fail first) ends as an interruption, exit 130."""

    def __init__(self):
        self.signalled = False

    def __call__(self, signum, frame):
        self.signalled = True
        raise KeyboardInterrupt

    @contextmanager
    def installed(self):
        previous = {s: signal.signal(s, self) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    interrupted = _Interrupted()
    try:
        with interrupted.installed():
            _command(args)
    except KeyboardInterrupt:
        return _interrupted(args)
    except (ValueError, RuntimeError, OSError) as exc:  # NotebookFailed is a RuntimeError; OSError: a full disk...
        if interrupted.signalled:
            return _interrupted(args)
        print(f"attn-companion {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    return 0


def _one_line(exc: BaseException) -> str:
    """The message of ``exc``; for an ``OSError``, its reason and the file it concerns (``[Errno 28] No space left
    on device: 'runs/...'``)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc) or type(exc).__name__


def _interrupted(args: argparse.Namespace) -> int:
    kept = {"book": f"; the previous book in {args.out} is kept",
            "sweep": f"; the finished runs in {args.out} are kept (a re-run skips them)",
            "windows": f"; the finished runs in {args.out} are kept (a re-run skips them)"}.get(args.command, "")
    print(f"\nattn-companion {args.command}: interrupted{kept}", file=sys.stderr)
    return 130


def _command(args: argparse.Namespace) -> None:
    """Run the command of ``args``: its arguments and parameters are checked before the heavy modules are imported."""
    if args.command in ("book", "run", "sweep", "windows"):
        _check_out(args.out)
    if args.command == "book":
        parameters = {**_params_line(args.params), **_parameters(args.parameter)}
        _check_book(parameters)
        from attn_utils.book import build, windows

        across = windows.load(args.windows) if args.windows is not None else None
        result = build.build_book(parameters, out=args.out, repository=args.repository, windows=across,
                                  reuse=args.reuse)
        print(f"book written to {result.html / 'index.html'}")
    elif args.command == "run":
        src, parameters = sources.resolve_notebook(args.notebook), _parameters(args.parameter)
        sources.check_specs(src, parameters)
        from attn_utils.book import sweep

        out = sweep.run_one(src, parameters, args.out, reuse=args.reuse)
        print(f"executed notebook: {out}")
    elif args.command == "sweep":
        src, grid = sources.resolve_notebook(args.notebook), _parameters(args.parameter, multi=True)
        for combination in sources.combinations(grid):
            sources.check_specs(src, combination)
        from attn_utils.book import sweep

        index = sweep.sweep(src, grid, args.out, cluster=sweep.Cluster(args.workers, args.scheduler),
                            force=args.force, reuse=args.reuse)
        print(f"sweep index: {index}\ntable: {index.parent / 'results.parquet'} (and results.csv)")
    elif args.command == "windows":
        from attn_utils.book import sweep, windows

        path = windows.run_windows(args.k, args.out, notebooks=args.notebooks, parameters=_parameters(args.parameter),
                                   cluster=sweep.Cluster(args.workers, args.scheduler), force=args.force,
                                   reuse=args.reuse)
        print(f"windows: {path} (and windows.csv); build the book with it: attn-companion book --windows {path}")
    elif args.command == "student":
        check_time_limit(args.time_limit)
        _preflight_exercises(args.notebooks, _parameters(args.parameter), args.exercises_only)
        from attn_utils.classroom import student

        released = student.write_course(args.out, args.notebooks, _parameters(args.parameter),
                                        time_limit=args.time_limit, exercises_only=args.exercises_only)
        print(f"nbgrader course written to {args.out}: {len(released)} assignment(s); hand out "
              f"{args.out / 'release'}, keep {args.out / 'source'} (solutions, hidden tests)")
    elif args.command == "corpus":
        print(_corpus(args.refresh))
    elif args.command == "grade":
        if args.time_limit is not None:
            check_time_limit(args.time_limit)
        from attn_utils.classroom import grading

        grading.grade(args.course, args.submissions or None, args.out, time_limit=args.time_limit,
                      sandboxed=args.sandboxed)
    else:
        _print_params(args.notebook)


if __name__ == "__main__":
    sys.exit(main())
