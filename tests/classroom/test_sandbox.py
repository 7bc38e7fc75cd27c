"""The sandbox of a submission's kernel (attn_utils.classroom.sandbox), with a small Python program in it instead of a
kernel: what it sees, what it may do, and that nothing of it outlives it. As root the kernel runs as the sandbox's
uid; as a plain user in a user namespace (run this module as both)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from attn_utils.classroom import sandbox

ROOT = Path(__file__).resolve().parents[2]
MARK = "attn-companion-sandbox-test-marker"

PROBE = r"""
import json, os, socket, sys
report = {"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(),
          "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
          "caps": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
          "interfaces": [name for _, name in socket.if_nameindex()], "seen": {}, "writes": {}}
for path in json.loads(sys.argv[1]):
    try:
        report["seen"][path] = os.listdir(path) if os.path.isdir(path) else open(path).read()
    except OSError:
        report["seen"][path] = False
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=5)
    report["net"] = "connected"
except OSError as exc:
    report["net"] = type(exc).__name__
for path in json.loads(sys.argv[3]):
    try:
        open(path, "w").write("x")
        report["writes"][path] = "written"
    except OSError as exc:
        report["writes"][path] = exc.strerror
open("report.json", "w").write(json.dumps(report))
"""


def run(box: sandbox.Sandbox, code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(box.command([sys.executable, "-c", code, *args]), cwd=box.work, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def marked() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if MARK in " ".join(p.info["cmdline"] or [])]


def test_the_probe_finds_what_this_machine_allows(jail):
    if os.geteuid() == 0:
        assert jail.mode == "root" and jail.uid != 0 and jail.gid != 0 and f"as uid {jail.uid}" in jail.describe()
    else:
        assert (jail.mode, jail.uid, jail.gid) == ("user", os.getuid(), os.getgid())
        assert "in a user namespace" in jail.describe()


def test_the_sandbox_sees_its_folder_and_the_libraries_only(jail, tmp_path):
    course = tmp_path / "course"
    (course / "source").mkdir(parents=True)
    (course / "gradebook.db").write_text("grades")
    listener = __import__("socket").create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    masked = Path(sys.prefix) / "include"  # a folder inside a bound one, hidden as a course inside it would be
    seen = [str(course), str(course / "gradebook.db"), str(ROOT / "tests"), str(ROOT / "notebooks"), str(masked),
            str(ROOT / "attn_utils" / "__init__.py"), "/etc/hostname" if Path("/etc/hostname").exists() else "/etc"]
    writes = [str(ROOT / "attn_utils" / "x.py"), str(Path(sys.prefix) / "x"), "/tmp/attn-sandbox-test", "/x"]
    with sandbox.Sandbox(jail, [course, masked]) as box:
        done = run(box, PROBE, json.dumps(seen), str(port), json.dumps(writes))
        assert done.returncode == 0, done.stderr + (box.work / sandbox.LOG).read_text()
        report = json.loads((box.work / "report.json").read_text())
        assert sorted(p.name for p in box.work.iterdir()) == [sandbox.LOG, "report.json"]
    listener.close()
    assert report["cwd"] == str(box.work)
    assert report["uid"] == jail.uid and report["gid"] == jail.gid and int(report["caps"], 16) == 0
    assert report["pids"] == [1, 2]  # the init and this program: not the grader, not the other submissions
    assert report["interfaces"] == ["lo"] and report["net"] != "connected"
    for path in seen[:5]:
        assert report["seen"][path] in (False, []), path
    assert report["seen"][seen[5]] == (ROOT / "attn_utils" / "__init__.py").read_text()
    assert all(why in ("Read-only file system", "Permission denied") for path, why in report["writes"].items()
               if not path.startswith("/tmp/")), report["writes"]
    assert report["writes"]["/tmp/attn-sandbox-test"] == "written" and not Path("/tmp/attn-sandbox-test").exists()
    assert not (ROOT / "attn_utils" / "x.py").exists()


def test_nothing_outlives_the_sandbox(jail):
    daemon = ("import os, sys, time\n"
              "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', {MARK!r}])\n"
              "    os._exit(0)\n"
              "os.wait()\n"
              "while not any(open(f'/proc/{p}/cmdline').read().endswith(" + repr(MARK + "\0") + ")\n"
              "              for p in os.listdir('/proc') if p.isdigit()):\n    time.sleep(0.05)\n")
    with sandbox.Sandbox(jail, []) as box:
        assert run(box, daemon).returncode == 0
        assert marked() == []  # the double-forked daemon died with the sandbox's init
    # the grader killed (kill -9): its launcher notices within a second, and the sandbox ends
    with sandbox.Sandbox(jail, []) as box:
        grader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                                   f"subprocess.Popen("
                                   f"{box.command([sys.executable, '-c', 'import time; time.sleep(600)', MARK])!r})\n"
                                   "time.sleep(600)"])
        deadline = time.monotonic() + 60
        while not marked() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked(), "the sandbox did not start"
        grader.kill()
        grader.wait()
        while marked() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked() == []


def test_memory_and_processes_are_limited(jail):
    """6 GiB of memory is refused and the processes are capped; mapping 6 GiB of a file is not memory (the shared
    libraries of torch's CUDA build map 3.6 GB, and a limit on the address space failed every kernel with them)."""
    code = ("import ctypes, mmap, os, time\n"
            "try:\n    big = bytearray(6 << 30)\n    memory = 'allocated'\n"
            "except MemoryError:\n    memory = 'refused'\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.mmap.restype, libc.mmap.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,"
            " ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"
            "open('small', 'wb').write(b'x')\n"
            "fd = os.open('small', os.O_RDONLY)\n"  # one read-only mapping of 6 GiB of a file, as a library is mapped
            "at = libc.mmap(None, 6 << 30, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)\n"
            "assert at not in (None, ctypes.c_void_p(-1).value), f'mmap failed: errno {ctypes.get_errno()}'\n"
            "children = 0\n"
            "try:\n    for _ in range(2000):\n        if os.fork() == 0:\n"
            "            time.sleep(30)\n            os._exit(0)\n"
            "        children += 1\nexcept OSError:\n    pass\n"
            "open('limits.txt', 'w').write(f'{memory} {children}')\n"
            "os.killpg(0, 9)\n")  # its session only: this test survives it
    with sandbox.Sandbox(jail, []) as box:
        run(box, code)
        memory, children = (box.work / "limits.txt").read_text().split()
    assert memory == "refused" and int(children) < sandbox.PROCESS_LIMIT
