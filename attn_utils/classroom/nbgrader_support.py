"""What the classroom adds to nbgrader: its executor, the course configuration, and the API in a course folder.

:class:`GuardedExecute` replaces nbgrader's ``Execute`` step of ``nbgrader autograde`` (the course's
``nbgrader_config.py`` installs it, so plain ``nbgrader autograde`` uses it too). It changes what happens
when a submission misbehaves, never how a passing cell scores:

- a kernel that dies (``os._exit``, a crash, out of memory) no longer makes nbgrader drop the whole
  submission: the cell where it died and every later cell get an error output, so they score zero,
  and the cells that had run keep their grades;
- a kernel that ignores the interrupt at the time limit is killed with what it started, and the
  remaining cells score zero in the same way (nbgrader alone would give up on the submission);
- a grade cell that raised cannot earn points through an ``execute_result`` the student's code
  printed before the error (nbgrader reads the first ``execute_result`` as partial credit): such
  outputs become ``display_data``;
- each cell keeps at most ``max_output_chars`` characters of output.

This module must stay light: ``nbgrader_config.py`` imports it in every nbgrader command.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from jupyter_core.utils import ensure_async, run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader import utils as nbutils
from nbgrader.preprocessors import Execute
from traitlets import Integer

from attn_utils.book import runlog
from attn_utils.book.build import environment

__all__ = ["CONFIG_FILE", "COURSE_ID", "GuardedExecute", "MARKER", "course_api", "is_course", "nbgrader_env",
           "write_config"]

CONFIG_FILE = "nbgrader_config.py"
COURSE_ID = "attn-companion"
MARKER = "# attn-companion course:"  # the first line of the config that `attn-companion student` writes


def _error(ename: str, evalue: str) -> NotebookNode:
    return new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class GuardedExecute(Execute):
    """nbgrader's ``Execute`` that survives dead and stuck kernels and caps each cell's output (see the module)."""

    max_output_chars = Integer(1_000_000, help="characters of output kept per cell (0: no limit)").tag(config=True)
    locked_cell_timeout = Integer(
        600, help="seconds a read-only cell of the chapter may run (loading a model, ...), if more than the "
                  "time limit of the other cells").tag(config=True)

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
        return super().preprocess(nb, resources, km)

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
            self._stopped = f"the kernel was killed at the time limit in an earlier cell (cell {index + 1} of the notebook)"
            self._kill_kernel()
            cell.outputs.append(_error("CellTimeoutError", f"this cell ran past the time limit ({self.timeout} s) "
                                                           f"and did not stop when interrupted: the kernel was "
                                                           f"killed, and the cells after it did not run"))
            resources = self.resources
        if nbutils.is_grade(cell) and any(o.output_type == "error" for o in cell.get("outputs", [])):
            for out in cell.outputs:  # only the test's own result may carry partial credit
                if out.output_type == "execute_result":
                    out.output_type = "display_data"
                    out.pop("execution_count", None)
        return cell, resources

    # --- output cap --------------------------------------------------------------------------------------

    def output(self, outs, msg, display_id, cell_index):
        kind = msg["msg_type"]
        if kind not in ("stream", "display_data", "execute_result", "update_display_data") or self.max_output_chars <= 0:
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

# attn-companion's executor (attn_utils.classroom.nbgrader_support.GuardedExecute): a kernel that dies
# or does not stop at the time limit zeroes only the cells that did not run, instead of failing the whole
# submission; it also caps each cell's output. Without attn_utils, nbgrader's own executor runs.
try:
    from attn_utils.classroom.nbgrader_support import GuardedExecute
except ImportError:
    pass
else:
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern, LimitOutput,
                                        SaveAutoGrades)

    c.Autograde.autograde_preprocessors = [GuardedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                           SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    c.GuardedExecute.max_output_chars = 1_000_000
    c.GuardedExecute.locked_cell_timeout = {locked}
'''


def write_config(course: Path, *, timeout: float, parameters: dict[str, dict[str, Any]],
                 exercises_only: bool) -> Path:
    """Write the course's ``nbgrader_config.py``: the per-cell time limit, and a record of the parameters."""
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


def course_api(course: Path, *, timeout: float | None = None):
    """nbgrader's API on ``course`` with the course's ``nbgrader_config.py`` (and ``timeout`` per cell, if given)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(CONFIG_FILE, path=str(course)).load_config()
    config.CourseDirectory.root = str(Path(course).resolve())
    if timeout is not None:
        config.Execute.timeout = math.ceil(timeout)
    quiet = logging.getLogger("traitlets")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL + 1)  # the API looks for a JupyterHub exchange, which a standalone course lacks
    try:
        api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    finally:
        quiet.setLevel(level)
    api.log_level = "WARN"
    return api
