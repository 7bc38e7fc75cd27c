"""The sandbox a submission's kernel runs in, made with Linux namespaces (no program to install).

The grader side (:func:`probe`, :class:`Sandbox`, :class:`SandboxedKernelManager`) prepares, for each
submission, a private folder and a description of the sandbox; jupyter_client then starts the kernel
through the launcher of this module (``python -I -m attn_utils.classroom.sandbox SPEC -- KERNEL...``),
which, before it runs the kernel,

1. joins the submission's memory and pids cgroups, when the grader could make them (cgroup v1 or v2
   that it may write: here, as root);
2. unshares the mount, PID, network, IPC and UTS namespaces, inside a new user namespace when the
   grader is not root (uid and gid mapped to themselves);
3. forks the PID namespace's init, which builds a new root on a tmpfs holding only read-only, nosuid
   binds of the system (``/usr``, ``/etc``, ``/bin`` ...), the Python installation, the environment
   and the package, the model caches, with the course, the submissions, the output folder and the
   grader's own files masked should one lie inside them, a private ``/tmp``, ``/dev`` with five
   devices, a ``/proc`` of the namespace, and the submission's folder as the only writable place;
   then ``pivot_root`` and the old root detached; the init is in a session of its own, so that no
   signal to a process group reaches outside;
4. starts the kernel in that folder with resource limits (data memory, processes, file size, no
   core files), ``no_new_privs``, a clean environment, its output to a log in its folder, and, as root,
   the dedicated unprivileged uid and gid (no capability is left; without root the kernel runs as the
   grader's uid without any capability in its namespace).

The kernel talks to the grader over Unix sockets in its folder (jupyter's ``ipc`` transport): it has no
network at all. The launcher passes jupyter's interrupt (SIGINT) through the init to the kernel. When
the kernel ends, the init ends, and the system kills every process left in the PID namespace (daemons
and double forks included); the init also ends when the launcher dies (``PR_SET_PDEATHSIG``), and the
launcher ends it when the grader dies or sends SIGTERM.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import platform
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Jail", "Sandbox", "SandboxUnavailable", "probe"]

SANDBOX_USER = "attn-sandbox"   # the dedicated account, if the machine has one (useradd --system attn-sandbox)
DEFAULT_UID = 64_999            # else a uid with no account and no process, as root
# bytes of data memory per process (RLIMIT_DATA: heap and anonymous mappings, not the shared libraries, whose
# address space alone is 3.6 GB for torch's CUDA build), and of memory for the whole sandbox (cgroup)
MEMORY_LIMIT = 4 << 30
PROCESS_LIMIT = 256             # processes (and threads) of the sandbox
FILE_LIMIT = 256 << 20          # bytes per file written
TMP_SIZE = "512m"               # the sandbox's /tmp (memory)
DEVICES = ("null", "zero", "full", "random", "urandom")
LOG = "kernel.log"              # in the sandbox's folder: what the kernel writes to its stdout and stderr
ENV_KEEP = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class SandboxUnavailable(RuntimeError):
    """The machine does not allow the sandbox (the message says what failed)."""


# --- Linux calls ------------------------------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}  # syscall numbers

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _locked_flags(path: str) -> int:
    """The flags of the mount holding ``path`` that a remount must keep (inside a user namespace it may not drop
    them): statvfs's ST_* bits are the MS_* ones, but for relatime."""
    f = os.statvfs(path).f_flag
    return (f & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)) \
        | (MS_RELATIME if f & 4096 else 0)


# --- the launcher and the init (they run before the kernel, in the sandbox's namespaces) -----------------------


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _join_cgroups(spec: dict) -> None:
    for folder in spec["cgroups"]:
        _write(os.path.join(folder, "cgroup.procs"), str(os.getpid()))


def _bind(root: str, source: str, *, writable: bool = False) -> None:
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    flags = _locked_flags(source) | MS_NOSUID | MS_NODEV | (0 if writable else MS_RDONLY)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | flags)


def _mask(root: str, path: str) -> None:
    """Hide ``path`` (a folder or file inside a bound folder) behind an empty read-only tmpfs or /dev/null."""
    target = root + path
    if not os.path.lexists(target):
        return
    if os.path.isdir(target):
        _mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")
    else:
        _mount("/dev/null", target, None, MS_BIND)


def _build_root(spec: dict) -> None:
    """The new root (see the module), then ``pivot_root`` into it; the old root is detached."""
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    for link, target in spec["links"].items():
        os.symlink(target, root + link)
    # the private /tmp first: a bound folder that lies under /tmp (a project cloned there) stays visible
    os.makedirs(root + "/tmp", exist_ok=True)
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMP_SIZE},mode=1777")
    for source in spec["binds"]:
        _bind(root, source)
    for path in spec["masks"]:
        _mask(root, path)
    _bind(root, spec["work"], writable=True)
    os.makedirs(root + "/dev", exist_ok=True)
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in DEVICES:
        open(f"{root}/dev/{name}", "a").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + "/dev/shm")
    _mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    for name, target in {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
                         "stderr": "/proc/self/fd/2"}.items():
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/proc", exist_ok=True)
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(root)
    _check(_libc.syscall(ctypes.c_long(PIVOT_ROOT[platform.machine()]), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _start_kernel(spec: dict, command: list[str]) -> int:
    """Fork the kernel: limits, no new privileges, the sandbox's uid (as root), its folder, a clean environment."""
    pid = os.fork()
    if pid:
        return pid
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        import resource

        for name, value in (("RLIMIT_DATA", MEMORY_LIMIT), ("RLIMIT_NPROC", PROCESS_LIMIT),
                            ("RLIMIT_FSIZE", FILE_LIMIT), ("RLIMIT_CORE", 0)):
            resource.setrlimit(getattr(resource, name), (value, value))
        report = os.dup(2)  # the launcher's stderr, for a failure before the kernel runs (closed by exec)
        os.set_inheritable(report, False)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if spec["mode"] == "root":
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        os.chdir(spec["work"])
        log = os.open(LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
        for fd in (1, 2):  # the kernel's own output: to its folder, not to the grader's terminal
            os.dup2(log, fd)
        os.closerange(3, report)
        os.closerange(report + 1, 65536)
        os.execvpe(command[0], command, spec["env"])
    except BaseException as exc:  # never return into the init's code
        with contextlib.suppress(BaseException):
            os.write(report, f"attn-companion sandbox: cannot start {command[0]}: {exc}\n".encode())
        os._exit(127)


def _init(spec: dict, command: list[str]) -> None:
    """PID 1 of the sandbox, in a session of its own (no signal from inside reaches a process outside): start the
    kernel, pass it the launcher's interrupts, reap every orphan, end when the kernel ends (which kills the rest)."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    os.setsid()
    kernel = 0
    signal.signal(signal.SIGINT, lambda *_: kernel and os.kill(kernel, signal.SIGINT))
    _build_root(spec)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    kernel = _start_kernel(spec, command)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if pid == kernel:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _map_user(uid: int, gid: int) -> None:
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def launch(spec_path: str, command: list[str]) -> int:
    """The launcher (see the module): returns the kernel's exit status."""
    try:
        with open(spec_path) as f:
            spec = json.load(f)
    except FileNotFoundError:  # the grader gave the sandbox up before this process started (it was interrupted)
        return 1
    parent = os.getppid()
    uid, gid = os.getuid(), os.getgid()
    _join_cgroups(spec)
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    _check(_libc.unshare(flags | (CLONE_NEWUSER if spec["mode"] == "user" else 0)), "unshare")
    if spec["mode"] == "user":
        _map_user(uid, gid)
    waited = [signal.SIGCHLD, signal.SIGTERM, signal.SIGINT]
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    init = os.fork()
    if init == 0:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, waited)
            _init(spec, command)
        except BaseException as exc:
            os.write(2, f"attn-companion sandbox: {exc}\n".encode())
        os._exit(126)
    while True:  # until the init ends: an interrupt goes to the kernel; a SIGTERM, or the grader gone, ends it
        got = signal.sigtimedwait(waited, 1.0)
        if got is not None and got.si_signo == signal.SIGINT:
            os.kill(init, signal.SIGINT)
        elif got is not None and got.si_signo == signal.SIGTERM or os.getppid() != parent:
            os.kill(init, signal.SIGKILL)
        pid, status = os.waitpid(init, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(status)


# --- the grader's side --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Jail:
    """What this machine allows: ``mode`` "root" (namespaces, then the sandbox's uid) or "user" (a user namespace),
    the uid and gid the kernel runs as, and whether the grader makes cgroups."""

    mode: str
    uid: int
    gid: int
    cgroups: bool

    def describe(self) -> str:
        who = (f"as uid {self.uid}" + (f" ({SANDBOX_USER})" if _account(self.uid) == SANDBOX_USER else "")
               if self.mode == "root" else f"in a user namespace, as uid {self.uid} without capabilities")
        limits = "a memory cgroup and a pids cgroup" if self.cgroups else "resource limits per process"
        return f"namespaces (mount, PID, network, IPC, UTS) {who}, {limits}"


def _account(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _sandbox_uid() -> int:
    """The dedicated account's uid, else :data:`DEFAULT_UID` if no account and no process has it."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(SANDBOX_USER).pw_uid
    if _account(DEFAULT_UID) is not None:
        raise SandboxUnavailable(f"uid {DEFAULT_UID} belongs to {_account(DEFAULT_UID)!r}: create a dedicated account "
                                 f"for the sandbox (useradd --system --no-create-home {SANDBOX_USER})")
    import psutil

    if any(p.info["uids"] and p.info["uids"].real == DEFAULT_UID for p in psutil.process_iter(["uids"])):
        raise SandboxUnavailable(f"a process runs as uid {DEFAULT_UID}: create a dedicated account for the sandbox "
                                 f"(useradd --system --no-create-home {SANDBOX_USER})")
    return DEFAULT_UID


def _own_cgroups() -> dict[str, Path]:
    """The folders of this process's memory and pids cgroups that it may write (v1, or v2 with both controllers
    delegated), keyed by controller ("" for v2)."""
    found = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(","):
            if name in ("memory", "pids"):
                found[name] = Path("/sys/fs/cgroup", name) / path.lstrip("/")
        if controllers == "" and (Path("/sys/fs/cgroup") / "cgroup.controllers").is_file():
            v2 = Path("/sys/fs/cgroup") / path.lstrip("/")
            with contextlib.suppress(OSError):
                if {"memory", "pids"} <= set((v2 / "cgroup.subtree_control").read_text().split()):
                    found[""] = v2
    usable = {k: v for k, v in found.items() if os.access(v, os.W_OK | os.X_OK)}
    return usable if "" in usable or {"memory", "pids"} <= set(usable) else {}


_probed: dict[bool, Jail] = {}


def probe() -> Jail:
    """What this machine allows, found by starting a sandbox that runs this Python (once per process)."""
    root = os.geteuid() == 0
    if root not in _probed:
        if PIVOT_ROOT.get(platform.machine()) is None or sys.platform != "linux":
            raise SandboxUnavailable(f"the sandbox needs Linux on one of {', '.join(PIVOT_ROOT)} "
                                     f"(this is {sys.platform} on {platform.machine()})")
        jail = Jail("root", _sandbox_uid(), _sandbox_uid(), bool(_own_cgroups())) if root \
            else Jail("user", os.getuid(), os.getgid(), bool(_own_cgroups()))
        with Sandbox(jail, []) as box:
            done = subprocess.run(box.command([sys.executable, "-c", "import os; os.stat(os.getcwd())"]),
                                  cwd=box.work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise SandboxUnavailable(f"a test sandbox failed ({why.removeprefix('attn-companion sandbox: ')})")
        _probed[root] = jail
    return _probed[root]


def _system_binds() -> tuple[list[str], dict[str, str]]:
    """The read-only folders of the system, and the top-level symbolic links (``/bin -> usr/bin``)."""
    binds, links = ["/usr", "/etc"], {}
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            links[str(path)] = os.readlink(path)
        elif path.is_dir():
            binds.append(str(path))
    return binds, links


def _caches() -> tuple[Path, Path]:
    """The companion's model cache and the Hugging Face hub's cache (not the rest of ``HF_HOME``, which may hold a
    token): read-only in the sandbox."""
    from huggingface_hub import constants

    from attn_utils.models import loading

    return loading.models_dir(), Path(constants.HF_HUB_CACHE)


def _python_binds() -> list[str]:
    """The Python installation, the environment, the package and the caches (the kernel imports and reads them),
    outside ``/usr``, each once."""
    import attn_utils

    paths = {Path(sys.base_prefix), Path(sys.prefix), Path(sys.exec_prefix), Path(attn_utils.__file__).parent,
             Path(sys.executable).resolve().parent, *_caches()}
    chosen: list[Path] = []
    for p in sorted(q.resolve() for q in paths if q.exists()):
        if not any(p.is_relative_to(c) for c in chosen) and not p.is_relative_to("/usr"):
            chosen.append(p)
    return [str(p) for p in chosen]


class Sandbox:
    """One submission's sandbox: a private folder (``work``, the kernel's working folder and home), the launcher's
    description, the cgroups. ``hidden`` are paths to mask should they lie inside a bound folder (the course, the
    submissions, the output folder). Close it (``with``) when the kernel has ended."""

    def __init__(self, jail: Jail, hidden: list[Path]):
        self.jail = jail
        self.base = Path(tempfile.mkdtemp(prefix="attn-sandbox-"))  # 0700: only the grader
        self.work = self.base / "work"
        (self.base / "root").mkdir()
        self.work.mkdir(mode=0o700)
        self.give(self.work)
        self.cgroups = self._make_cgroups() if jail.cgroups else []
        binds, links = _system_binds()
        binds += _python_binds()
        masks = sorted({str(q) for q in (Path(p).resolve() for p in [*hidden, self.base])
                        if any(q.is_relative_to(b) for b in binds)})
        models, hub = _caches()
        env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
        env.update(PATH=os.pathsep.join([os.path.dirname(os.path.abspath(sys.executable)), "/usr/bin", "/bin"]),
                   HOME=str(self.work), TMPDIR="/tmp", MPLCONFIGDIR=str(self.work / ".matplotlib"),
                   HF_HUB_OFFLINE="1", ATTN_COMPANION_MODELS=str(models), HF_HUB_CACHE=str(hub),
                   HF_HOME=str(self.work / ".huggingface"), ATTN_COMPANION_RUN_DIR=str(self.work / "runs"))
        self.env = env  # the kernel's environment (the grader adds to it before the kernel starts)
        self.spec = self.base / "spec.json"
        self._spec = {"mode": jail.mode, "uid": jail.uid, "gid": jail.gid, "root": str(self.base / "root"),
                      "work": str(self.work), "binds": binds, "links": links, "masks": masks,
                      "cgroups": [str(c) for c in self.cgroups]}

    def _make_cgroups(self) -> list[Path]:
        made = []
        for controller, parent in _own_cgroups().items():
            folder = parent / self.base.name
            folder.mkdir()
            made.append(folder)
            if controller in ("", "memory"):
                _write(str(folder / ("memory.max" if controller == "" else "memory.limit_in_bytes")), str(MEMORY_LIMIT))
            if controller in ("", "pids"):
                _write(str(folder / "pids.max"), str(PROCESS_LIMIT))
        return made

    def command(self, kernel: list[str]) -> list[str]:
        """The command that runs ``kernel`` in this sandbox (``-I``: the launcher imports nothing from its folder).
        The description goes to the launcher's file now, with :attr:`env` as it is then."""
        self.spec.write_text(json.dumps({**self._spec, "env": self.env}))
        kernel = [os.path.abspath(kernel[0]) if os.sep in kernel[0] else kernel[0], *kernel[1:]]  # no "tests/../"
        return [sys.executable, "-I", "-m", "attn_utils.classroom.sandbox", str(self.spec), "--", *kernel]

    def give(self, path: Path) -> None:
        """Let the sandbox's uid read and write ``path`` (a file the grader wrote into the folder)."""
        if self.jail.mode == "root":
            os.chown(path, self.jail.uid, self.jail.gid)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill a launcher still running (one the grader was interrupted before it could stop) and what is left in
        the cgroups, remove them and the folder."""
        import psutil

        left = [p for p in psutil.process_iter(["cmdline"]) if str(self.spec) in (p.info["cmdline"] or [])]
        for p in left:  # the launcher and its fork, the init: when the init is gone, every process of the sandbox is
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(left, timeout=30)
        for folder in self.cgroups:
            for attempt in range(200):
                with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
                    for pid in (folder / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY while the system reaps the last processes
                    if exc.errno != errno.EBUSY or attempt == 199:
                        raise
                    time.sleep(0.01)
        shutil.rmtree(self.base, ignore_errors=True)


if __name__ == "__main__":
    split = sys.argv.index("--")
    try:
        sys.exit(launch(sys.argv[1], sys.argv[split + 1:]))
    except OSError as exc:  # one line for the grader's log, no traceback
        os.write(2, f"attn-companion sandbox: {exc}\n".encode())
        sys.exit(126)
