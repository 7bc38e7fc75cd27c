"""What the classroom adds to nbgrader: its executor, a sanitizing step, the course configuration, the API.

:class:`GuardedExecute` replaces nbgrader's ``Execute`` step of ``nbgrader autograde`` (the course's
``nbgrader_config.py`` installs it, so plain ``nbgrader autograde`` uses it too). It

- starts each submission's kernel in the sandbox of :mod:`attn_utils.classroom.sandbox` (a private
  folder holding only that submission; no view of the course, the other submissions, the feedback or
  the gradebook; no network; memory and process limits; every process killed when the kernel ends),
  unless ``GuardedExecute.sandbox`` is off;
- decides the hidden tests itself (:mod:`attn_utils.classroom.hidden`): it draws their inputs, gives
  them to the kernel in a file of its folder, takes what the test cells return out of their outputs,
  and appends an error to every test cell that has not failed already and whose answers are wrong or
  missing, so that nbgrader scores it zero; the kernel cannot change a verdict;

- a kernel that dies (``os._exit``, a crash, out of memory) no longer makes nbgrader drop the whole
  submission: the cell where it died and every later cell get an error output, so they score zero,
  and the cells that had run keep their grades;
- a kernel that ignores the interrupt at the time limit is killed with what it started, and the
  remaining cells score zero in the same way (nbgrader alone would give up on the submission);
- a grade cell cannot earn points through an ``execute_result`` the student's code printed
  (nbgrader reads the first ``execute_result`` as partial credit): such outputs become ``display_data``;
- each cell keeps at most ``max_output_chars`` characters of output.

:class:`ReleasedCells` runs first when nbgrader sanitizes a submission: the cells go back into the
released notebook's order with its nbgrader metadata (:func:`restore_cells`), so extra, moved or
forged cells never break grading and a forged graded cell earns nothing.

This module must stay light: ``nbgrader_config.py`` imports it in every nbgrader command.
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import psutil
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader import utils as nbutils
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Integer, List, Unicode

from attn_utils.book import runlog
from attn_utils.book.build import environment
from attn_utils.classroom import hidden
from attn_utils.classroom.limits import MAX_TIME_LIMIT, check_time_limit
from attn_utils.classroom.sandbox import Sandbox, probe

__all__ = ["CONFIG_FILE", "COURSE_ID", "GuardedExecute", "MARKER", "METADATA_KEY", "MAX_TIME_LIMIT", "ReleasedCells",
           "SandboxedKernelManager", "check_time_limit", "course_api", "is_course", "judged_outside", "nbgrader_env",
           "released_notebook", "restore_cells", "write_config"]

CONFIG_FILE = "nbgrader_config.py"
COURSE_ID = "attn-companion"
MARKER = "# attn-companion course:"  # the first line of the config that `attn-companion student` writes
METADATA_KEY = "attn_companion"     # notebook metadata: the chapter, its exercises, the parameters
INPUTS_FILE = "hidden-inputs.json"  # in the kernel's folder: the inputs of the hidden tests


def _error(ename: str, evalue: str) -> NotebookNode:
    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class SandboxedKernelManager(AsyncKernelManager):
    """jupyter's kernel manager with the kernel in a :class:`~attn_utils.classroom.sandbox.Sandbox` (:meth:`use`):
    its connection file and Unix sockets (the ``ipc`` transport) in the sandbox's folder, its command wrapped by
    the sandbox's launcher, its working folder the sandbox's."""

    def use(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.transport = "ipc"
        self.ip = str(sandbox.work / "kernel")
        self.connection_file = str(sandbox.work / "kernel.json")

    def write_connection_file(self, **kwargs) -> None:
        super().write_connection_file(**kwargs)
        self.sandbox.give(Path(self.connection_file))

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return self.sandbox.command(super().format_kernel_cmd(extra_arguments))


class GuardedExecute(Execute):
    """nbgrader's ``Execute`` with the sandbox and the hidden tests decided outside the kernel; it survives dead and
    stuck kernels and caps each cell's output (see the module)."""

    max_output_chars = Integer(1_000_000, help="characters of output kept per cell (0: no limit)").tag(config=True)
    locked_cell_timeout = Integer(
        600, help="seconds a read-only cell of the chapter may run (loading a model, ...), if more than the "
                  "time limit of the other cells").tag(config=True)
    sandbox = Bool(True, help="run each kernel in the classroom's sandbox (attn_utils.classroom.sandbox); without "
                              "it a submission runs with the grader's permissions").tag(config=True)
    hidden_paths = List(Unicode(), help="folders and files the kernels must not see, besides the course folder "
                                        "(the submissions, the grades and feedback)").tag(config=True)

    def _get_timeout(self, cell: NotebookNode | None) -> int | None:
        """The time limit of a cell: the read-only cells of the chapter may take ``locked_cell_timeout``; a
        student's cell and a test cell (which calls the student's functions) take ``timeout``."""
        timeout = super()._get_timeout(cell)
        if cell is not None and timeout and nbutils.is_locked(cell) and not nbutils.is_grade(cell):
            return max(timeout, self.locked_cell_timeout)
        return timeout

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None):
        self._stopped: str | None = None
        self._sizes: dict[int, int] = {}
        self._truncated: set[tuple[int, str]] = set()
        self._inputs = _draw_hidden(nb)
        self._answers: dict[int, Any] = {}
        with self._kernel_folder(nb) as folder:
            self._folder = folder
            try:
                return super().preprocess(nb, resources, km)
            except BaseException:  # Ctrl-C while the kernel started: nbclient cleans up only a kernel that is up
                self._abandon()
                raise

    def _abandon(self) -> None:
        """Stop the kernel's client and kill the kernel with what it started, where nbclient left them."""
        if getattr(self, "kc", None) is not None:
            with contextlib.suppress(Exception):
                self.kc.stop_channels()
            self.kc = None
        if self.km is not None:
            _kill(_family(self._kernel_process()))

    @contextlib.contextmanager
    def _kernel_folder(self, nb: NotebookNode) -> Iterator[Path]:
        """The kernel's private folder (the sandbox's, or a temporary one without the sandbox), holding the
        submission and the hidden tests' inputs."""
        self._box = None
        with contextlib.ExitStack() as stack:
            if self.sandbox:
                root = CourseDirectory(config=self.config).root
                self._box = stack.enter_context(Sandbox(probe(), [Path(root), *map(Path, self.hidden_paths)]))
                folder = self._box.work
            else:
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attn-kernel-")))
            for name, text in ((INPUTS_FILE, json.dumps({f"{i['key']}/{i['part']}": i for i in self._inputs.values()})),
                               (f"{nb.metadata.get(METADATA_KEY, {}).get('notebook', 'submission')}.ipynb",
                                nbformat.writes(nb))):
                (folder / name).write_text(text)
                if self._box is not None:
                    self._box.give(folder / name)
            if self._box is not None:
                self._box.env[hidden.INPUTS_ENV] = str(folder / INPUTS_FILE)
            yield folder

    def create_kernel_manager(self):
        if self._box is None:
            return super().create_kernel_manager()
        self.kernel_manager_class = SandboxedKernelManager
        km = super().create_kernel_manager()
        km.use(self._box)
        return km

    async def async_start_new_kernel(self, **kwargs: Any) -> None:
        kwargs["cwd"] = str(self._folder)
        if self._box is None:
            kwargs["env"] = {**os.environ, hidden.INPUTS_ENV: str(self._folder / INPUTS_FILE)}
        await super().async_start_new_kernel(**kwargs)

    start_new_kernel = run_sync(async_start_new_kernel)

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int):
        runs = cell.cell_type == "code" and cell.source.strip()
        if self._stopped is not None:
            if runs:
                cell.outputs = [_error("NotRun", self._stopped)]
            return cell, self.resources
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._stopped = f"the kernel died in an earlier cell (cell {index + 1} of the notebook)"
            cell.outputs.append(_error("DeadKernelError", "the kernel died while this cell ran (os._exit, a crash "
                                                          "or out of memory); the cells after it did not run"))
            resources = self.resources
        except CellTimeoutError:
            self._stopped = (f"the kernel was killed at the time limit in an earlier cell "
                             f"(cell {index + 1} of the notebook)")
            self._kill_kernel()
            cell.outputs.append(_error("CellTimeoutError", f"this cell ran past the time limit ({self.timeout} s) "
                                                           f"and did not stop when interrupted: the kernel was "
                                                           f"killed, and the cells after it did not run"))
            resources = self.resources
        if index in self._inputs and self._stopped is None and not any(o.output_type == "error" for o in cell.outputs):
            failure = hidden.judge(self._inputs[index], self._answers.get(index))
            if failure:
                cell.outputs.append(_error("HiddenTestFailed", failure))
        if nbutils.is_grade(cell) and cell.cell_type == "code":
            for out in cell.outputs:  # no partial credit from what the student's code printed
                if out.output_type == "execute_result":
                    out.output_type = "display_data"
                    out.pop("execution_count", None)
        return cell, resources

    # --- output cap --------------------------------------------------------------------------------------

    def output(self, outs, msg, display_id, cell_index):
        kind = msg["msg_type"]
        data = msg["content"].get("data") if kind in ("display_data", "execute_result", "update_display_data") else None
        if isinstance(data, dict) and hidden.MIME in data:  # a test cell's answers: for the grader, not the notebook
            if kind == "display_data" and cell_index in self._inputs:
                self._answers[cell_index] = data[hidden.MIME]
            return None
        if (kind not in ("stream", "display_data", "execute_result", "update_display_data")
                or self.max_output_chars <= 0):
            return super().output(outs, msg, display_id, cell_index)
        content = msg["content"]
        text = content.get("text", "") if kind == "stream" else ""
        size = len(text) if kind == "stream" else sum(len(str(v)) for v in content.get("data", {}).values())
        used = self._sizes.get(cell_index, 0)
        if used + size <= self.max_output_chars:
            self._sizes[cell_index] = used + size
            return super().output(outs, msg, display_id, cell_index)
        name = content.get("name", "stdout") if kind == "stream" else "stdout"
        self._sizes[cell_index] = self.max_output_chars
        keep = text[:max(0, self.max_output_chars - used)]
        if (cell_index, name) in self._truncated:
            return None
        self._truncated.add((cell_index, name))
        notice = f"\n[output cut by the grader: this cell wrote more than {self.max_output_chars} characters]\n"
        out = new_output("stream", name=name, text=keep + notice)
        outs.append(out)
        return out

    # --- killing a stuck kernel and what it started ----------------------------------------------------------

    def _kernel_process(self) -> psutil.Process | None:
        provisioner = getattr(self.km, "provisioner", None)
        pid = getattr(provisioner, "pid", None) or getattr(getattr(provisioner, "process", None), "pid", None)
        try:
            return psutil.Process(pid) if pid else None
        except psutil.Error:
            return None

    def _kill_kernel(self) -> None:
        kernel = self._kernel_process()
        family = _family(kernel)
        with contextlib.suppress(Exception):
            run_sync(_shutdown)(self.km)
        _kill(family)

    async def _async_cleanup_kernel(self) -> None:
        family = _family(self._kernel_process()) if self.km is not None else []
        try:
            await super()._async_cleanup_kernel()
        finally:
            _kill(family)  # whatever the submission started and left running

    _cleanup_kernel = run_sync(_async_cleanup_kernel)


def _draw_hidden(nb: NotebookNode) -> dict[int, dict]:
    """The inputs of the hidden test of every test cell of ``nb`` (by cell index), from fresh seeds."""
    parts = {hidden.test_id(key, part): (key, part) for key, tests in hidden.HIDDEN.items() for part in tests.parts}
    found = {}
    for index, cell in enumerate(nb.cells):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id") if nbutils.is_grade(cell) else None
        if cell.cell_type == "code" and grade_id in parts:
            found[index] = hidden.draw(*parts[grade_id], int.from_bytes(os.urandom(4), "big"))
    return found


async def _shutdown(km) -> None:
    await ensure_async(km.shutdown_kernel(now=True))


def _family(process: psutil.Process | None) -> list[psutil.Process]:
    if process is None:
        return []
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


def _kill(processes: list[psutil.Process]) -> None:
    for p in processes:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(processes, timeout=5)


# --- the submitted cells, put back into the released notebook ------------------------------------------------

_GRADING_KEYS = ("grade", "solution", "locked", "task", "points")


def _course_key(cell: NotebookNode) -> tuple[str, str | None]:
    """What identifies a cell of the course: its nbgrader grade id, else its nbformat id."""
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    return ("grade", grade_id) if isinstance(grade_id, str) else ("cell", cell.get("id"))


def _forged(cell: NotebookNode) -> str:
    meta = cell.metadata.get("nbgrader")
    meta = meta if isinstance(meta, dict) else {}
    points = f", {meta['points']} points" if meta.get("grade") and "points" in meta else ""
    return f"{meta.get('grade_id', 'a cell')!r} ({'graded' if meta.get('grade') else 'nbgrader'} metadata{points})"


def restore_cells(cells: list[NotebookNode], released: list[NotebookNode]) -> tuple[list[NotebookNode], list[str]]:
    """A submission's ``cells`` in the order of the ``released`` notebook's cells, and what was ignored.

    Each released cell is matched by its course id (its nbgrader grade id, or its nbformat id for a cell
    without nbgrader metadata) with the first cell of the submission that has it, which keeps its source and
    outputs but takes the released cell's nbgrader metadata (a changed cell type brings the released cell
    back); a released cell the submission lacks comes back as released. Every other cell of the submission
    runs after the released cell it followed; nbgrader metadata on such a cell (a graded cell the course does
    not have, a second copy of an id) is dropped, and the cell reported, as is changed metadata of a course
    cell."""
    keys = [_course_key(c) for c in released]
    where = {k: i for i, k in enumerate(keys)}
    taken: dict[tuple, NotebookNode] = {}
    extra: dict[int, list[NotebookNode]] = {}
    ignored, anchor = [], -1
    for cell in cells:
        key = _course_key(cell)
        if key in where and key not in taken:
            taken[key], anchor = cell, where[key]
            continue
        cell = copy.deepcopy(cell)
        if "nbgrader" in cell.metadata:
            ignored.append(_forged(cell))
            del cell.metadata["nbgrader"]
        extra.setdefault(anchor, []).append(cell)
    out = list(extra.get(-1, []))
    for i, (key, course) in enumerate(zip(keys, released)):
        cell = taken.get(key)
        if cell is None or cell.cell_type != course.cell_type:
            cell = copy.deepcopy(course)
        else:
            mine, theirs = cell.metadata.get("nbgrader"), course.metadata.get("nbgrader")
            if mine is not None and (not isinstance(mine, dict) or theirs is None
                                     or any(mine.get(k) != theirs.get(k) for k in _GRADING_KEYS)):
                ignored.append(_forged(cell))
            cell = copy.deepcopy(cell)
            cell.metadata.pop("nbgrader", None)
            if theirs is not None:
                cell.metadata["nbgrader"] = copy.deepcopy(theirs)
        out += [cell, *extra.get(i, [])]
    seen: set[str] = set()
    for cell in out:  # a copied cell keeps its nbformat id: give it a new one
        if cell.get("id") in seen:
            cell.id = nbformat.v4.new_code_cell().id
        seen.add(cell.get("id"))
    return out, ignored


def released_notebook(config, assignment: str, notebook: str) -> NotebookNode:
    """The released notebook of ``assignment`` in the course of ``config`` (nbgrader's CourseDirectory)."""
    coursedir = CourseDirectory(config=config)
    path = Path(coursedir.format_path(coursedir.release_directory, ".", assignment)) / f"{notebook}.ipynb"
    return nbformat.read(path, as_version=4)


class ReleasedCells(NbGraderPreprocessor):
    """The first sanitizing step of ``nbgrader autograde``: the submission's cells put back into the released
    notebook (:func:`restore_cells`); what was ignored is logged."""

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        info = resources["nbgrader"]
        nb.cells, ignored = restore_cells(nb.cells, released_notebook(self.config, info["assignment"],
                                                                      info["notebook"]).cells)
        for what in ignored:
            self.log.warning("ignored the nbgrader metadata of %s: the released notebook's is graded", what)
        return nb, resources


# --- the course configuration -------------------------------------------------------------------------------

CONFIG = '''\
{marker} written by `attn-companion student` (attn_utils.classroom). nbgrader reads it in this folder.
#
# The notebooks were written with these parameters, baked into their read-only parameters cells:
#     {parameters}
# Chapters: {chapters}{mode}
c = get_config()  # noqa: F821 (nbgrader's config loader defines it)

c.CourseDirectory.course_id = "{course_id}"

# A student's cell or a test cell that runs longer than this is interrupted and scores zero (seconds;
# `attn-companion grade --time-limit` overrides it for one run). The chapter's read-only cells may take
# GuardedExecute.locked_cell_timeout (below).
c.Execute.timeout = {timeout}
c.Execute.interrupt_on_timeout = True

# A deleted test cell is put back, so deleting it cannot avoid the test.
c.OverwriteCells.add_missing_cells = True

# What a solution region becomes in the students' copies.
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# At most 1000 lines of output per cell in the graded notebooks and the feedback.
c.LimitOutput.max_lines = 1000

# attn-companion's steps (attn_utils.classroom.nbgrader_support). ReleasedCells puts a submission's cells
# back into the released notebook's order and metadata (extra, moved or forged cells never break grading).
# GuardedExecute runs each kernel in the classroom's sandbox (no view of this folder, no network, limits,
# every process killed at the end), decides the hidden tests outside the kernel, zeroes only the cells that
# did not run when a kernel dies or does not stop at the time limit, and caps each cell's output. Without
# attn_utils, nbgrader's own steps run, and every test cell fails (its hidden test needs attn_utils).
try:
    from attn_utils.classroom.nbgrader_support import GuardedExecute, ReleasedCells
except ImportError:
    pass
else:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput, DeduplicateIds,
                                        IgnorePattern, LimitOutput, OverwriteCells, OverwriteKernelspec,
                                        SaveAutoGrades)

    c.Autograde.sanitize_preprocessors = [ReleasedCells, ClearOutput, DeduplicateIds, OverwriteKernelspec,
                                          OverwriteCells, CheckCellMetadata]
    c.Autograde.autograde_preprocessors = [GuardedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                           SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    c.GuardedExecute.max_output_chars = 1_000_000
    c.GuardedExecute.locked_cell_timeout = {locked}
'''


def write_config(course: Path, *, timeout: float, parameters: dict[str, dict[str, Any]],
                 exercises_only: bool) -> Path:
    """Write the course's ``nbgrader_config.py``: the per-cell time limit, and a record of the parameters."""
    timeout = check_time_limit(timeout)
    shown = "; ".join(f"{stem}: " + (", ".join(f"{k} = {v!r}" for k, v in values.items()) or "the defaults")
                      for stem, values in parameters.items())
    mode = "\n# Each notebook holds only the exercises of its chapter (--exercises-only)." if exercises_only else ""
    path = Path(course) / CONFIG_FILE
    path.write_text(CONFIG.format(marker=MARKER, parameters=shown or "the defaults", chapters=", ".join(parameters),
                                  mode=mode, course_id=COURSE_ID, timeout=math.ceil(timeout),
                                  locked=max(600, math.ceil(timeout))))
    return path


def is_course(folder: Path) -> bool:
    """Whether ``folder`` holds a course that ``attn-companion student`` wrote."""
    config = Path(folder) / CONFIG_FILE
    try:
        return config.is_file() and config.read_text().startswith(MARKER)
    except OSError:
        return False


def judged_outside(folder: Path) -> bool:
    """Whether the course in ``folder`` is graded with the steps of this version (:class:`ReleasedCells`, the
    hidden tests judged outside the kernel); an earlier version's course decided them inside it."""
    return "ReleasedCells" in (Path(folder) / CONFIG_FILE).read_text()


@contextlib.contextmanager
def nbgrader_env(run_dir: Path | None = None) -> Iterator[None]:
    """The environment nbgrader needs in this process: the interpreter's ``bin`` on ``PATH`` (nbgrader runs
    the ``alembic`` command when it creates a gradebook), quiet SQLAlchemy warnings, and the kernels'
    run records in ``run_dir``."""
    values = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if run_dir is not None:
        values[runlog.RUN_DIR_ENV] = str(run_dir)
    with environment(values), warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="nbgrader")
        warnings.filterwarnings("ignore", message=".*not in session.*")
        warnings.filterwarnings("ignore", message=".*is not able to be represented.*")  # glue's records in HTML
        yield


def course_api(course: Path, *, timeout: float | None = None, sandbox: bool = True, hidden_paths: list[Path] = ()):
    """nbgrader's API on ``course`` with the course's ``nbgrader_config.py`` (and ``timeout`` per cell, if given),
    its kernels sandboxed or not, ``hidden_paths`` out of their sight."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(CONFIG_FILE, path=str(course)).load_config()
    config.CourseDirectory.root = str(Path(course).resolve())
    if timeout is not None:
        config.Execute.timeout = math.ceil(timeout)
    config.GuardedExecute.sandbox = sandbox
    config.GuardedExecute.hidden_paths = [str(Path(p).resolve()) for p in hidden_paths]
    quiet = logging.getLogger("traitlets")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL + 1)  # the API looks for a JupyterHub exchange, which a standalone course lacks
    try:
        api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    finally:
        quiet.setLevel(level)
    api.log_level = "WARN"
    return api
