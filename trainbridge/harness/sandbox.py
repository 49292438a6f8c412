"""Audit hooks that keep a program to its own folder while the harness runs it.

A candidate is untrusted code (docs/measurement_integrity.md), and the program folder links
the user's data and checkpoints in (`runner.materialize`). Inside the child, Python's audit
hooks (`sys.addaudithook`) refuse, with a `SandboxViolation` that names the call:

* a write to any file whose real path is outside the program folder, the run's output
  folder, the temporary folder and the compiler caches, or inside the user's workload folder
  wherever it lies (so a write through a link to the user's data, or to `~/.bashrc`, fails,
  while logs and checkpoints in the program folder work);
* opening any file of the run folder (the loop's own records: reference losses, other
  candidates' results, the ledger) outside the program's folder and the harness's output
  folders, for reading too: a candidate has no business with the references it is judged by;
* opening the harness's own files (requests, results, step records) from the program's own
  code: a program that could read them could tell a validation run from a timed one;
* importing the harness (`trainbridge`) from the program's own code (a module not imported
  yet; the guard refuses the spelling);
* a network connection to anything but this machine (collectives on loopback still work);
* starting a process, and loading a shared library through ctypes, when the nearest caller
  outside the standard library is the program's own code. A library the program calls
  (Inductor starting its compiler, a DataLoader forking workers) is not refused.

This is a tripwire for the direct spellings, not a jail: code that reaches a process through
a library on its behalf is not seen here, and an OS sandbox (namespaces, seccomp) would be
the next step. A program that needs one of these for a good reason runs with
`[limits] sandbox = false` in its trainbridge.toml.
"""

from __future__ import annotations

import ipaddress
import os
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.fork",
                             "os.forkpty", "os.exec", "pty.spawn"})
_NETWORK_EVENTS = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"})
_WATCHED = _PROCESS_EVENTS | _NETWORK_EVENTS | {"open", "os.truncate", "ctypes.dlopen", "import"}
_STDLIB = tuple(str(Path(p).resolve()) + os.sep for p in {sysconfig.get_paths()["stdlib"],
                                                            sysconfig.get_paths()["platstdlib"]})
_LIBRARIES = tuple(str(Path(p).resolve()) + os.sep for p in {*site.getsitepackages(), site.getusersitepackages(),
                                                               sysconfig.get_paths()["purelib"],
                                                               sysconfig.get_paths()["platlib"]})
"""Installed packages (site-packages sits inside the standard library's folder: it is not stdlib)."""


class SandboxViolation(PermissionError):
    """The program tried something the harness does not let a program do (module doc)."""


def _real(path) -> str | None:
    if isinstance(path, int):
        return None  # an already open descriptor: its opening was checked
    try:
        return os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r.rstrip(os.sep) or path.startswith(r) for r in roots)


def _is_write(mode, flags) -> bool:
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _local_address(address) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX: a path or an abstract name
        return True
    if not isinstance(address, tuple) or not address:
        return True
    host = address[0]
    if host in ("", "localhost", "0.0.0.0", "::"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: resolved elsewhere, not this machine


class Sandbox:
    def __init__(self, program_dir: str, write_roots: list[str], read_only_roots=(), private_roots=()):
        self.program_dir = os.path.realpath(program_dir) + os.sep
        self.read_only_roots = tuple(os.path.realpath(r) + os.sep for r in read_only_roots)
        self.private_roots = tuple(os.path.realpath(r) + os.sep for r in private_roots)
        home = Path.home()
        own = [program_dir, *write_roots]
        self.harness_roots = tuple(os.path.realpath(str(r)) + os.sep for r in write_roots if r)
        scratch = [tempfile.gettempdir(), "/dev", home / ".cache", home / ".triton",
                   os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")]
        self.own_roots = tuple(os.path.realpath(str(r)) + os.sep for r in own if r)
        self.scratch_roots = tuple(os.path.realpath(str(r)) + os.sep for r in scratch if r)

    def may_write(self, real: str) -> bool:
        """The program's folder and the harness's output folders always; the temporary and cache
        folders unless the path lies in the user's workload (which may itself be under /tmp)."""
        if _under(real, self.own_roots):
            return True
        return _under(real, self.scratch_roots) and not _under(real, self.read_only_roots)

    def _program_caller(self) -> str | None:
        """file:line of the program's own code when it is the nearest non-stdlib caller."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_filename
            real = os.path.realpath(name)
            if name == __file__ or name.startswith("<frozen") or (_under(real, _STDLIB)
                                                                   and not _under(real, _LIBRARIES)):
                f = f.f_back
                continue
            return f"{os.path.relpath(real, self.program_dir)}:{f.f_lineno}" if real.startswith(self.program_dir) \
                else None
        return None

    def may_open(self, real: str) -> bool:
        """Inside the run folder, only the program's own folder and the harness's outputs."""
        return (not _under(real, self.private_roots) or _under(real, self.own_roots)
                or _under(real, self.read_only_roots))  # the user's workload, wherever it was laid out

    def __call__(self, event: str, args: tuple) -> None:
        if event not in _WATCHED:
            return
        if event == "import":
            name = args[0] if args and isinstance(args[0], str) else ""
            if name.split(".")[0] == "trainbridge" and (where := self._program_caller()) is not None:
                raise SandboxViolation(f"sandbox: the program may not import the harness ({name} at {where})")
            return
        if event == "open" or event == "os.truncate":
            real = _real(args[0])
            if real is not None and _under(real, self.harness_roots) and not _under(real, (self.program_dir,)) \
                    and not _under(real, self.read_only_roots) and (where := self._program_caller()) is not None:
                raise SandboxViolation(f"sandbox: the program may not open the harness's own files ({real} at "
                                       f"{where}): which run this is is not the program's to know")
            if real is not None and self.private_roots and not self.may_open(real):
                raise SandboxViolation(f"sandbox: the program may not open {real}: the run's own records are "
                                       "not the program's to read")
            if event == "open" and not _is_write(args[1], args[2] if len(args) > 2 else None):
                return
            if real is not None and not self.may_write(real):
                raise SandboxViolation(f"sandbox: the program may not write {real} (the user's workload, or "
                                       "outside its folder, the run folder and the temporary and cache folders)")
        elif event in _NETWORK_EVENTS:
            if not _local_address(args[1] if len(args) > 1 else None):
                raise SandboxViolation(f"sandbox: the program may not open a network connection ({event} "
                                       f"{args[1]!r}); only this machine's loopback is allowed")
        elif (where := self._program_caller()) is not None:
            what = "start a process" if event in _PROCESS_EVENTS else "load a library through ctypes"
            raise SandboxViolation(f"sandbox: the program may not {what} ({event} at {where}); a program that "
                                   "needs to sets `[limits] sandbox = false` in its trainbridge.toml")


def install(program_dir: str, write_roots: list[str], read_only_roots=(), private_roots=()) -> None:
    """Audit hooks cannot be removed: install once, in the child, right before the program runs."""
    sys.addaudithook(Sandbox(program_dir, write_roots, read_only_roots, private_roots))
