"""Where to probe in a given process: everything that depends on the interpreter build.

A :class:`ProbePlan` names the uprobes that trace one process's GIL hand-offs.
The plan anchors on libc, whose functions are never inlined into CPython:
``pthread_cond_signal`` on the GIL's ``cond`` is a release (``drop_gil``, even
where LTO inlined it), on its ``switch_cond`` an acquisition (``take_gil`` with
FORCE_SWITCHING, every CPython 3.x); ``pthread_cond_timedwait`` on ``cond``
starts a contended wait. The two addresses differ per process (ASLR) and are
learned by the BPF side from one ``take_gil`` entry (the bootstrap probe).

Files are opened as the process maps them, whatever its root: through
``/proc/<pid>/root`` (containers), as ``/proc/<pid>/maps`` names them (a chroot
in the collector's mount namespace: the path already includes the root), or
through ``/proc/<pid>/map_files/`` (any root, and a file deleted or replaced
since it was mapped), each checked against the mapped inode.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from otel_gil_collector import elf, pyprocess
from otel_gil import protocol
from otel_gil import ring

# &gil->switch_cond - &gil->cond: sizeof(pthread_cond_t) + sizeof(pthread_mutex_t).
COND_STRIDE = {"EM_X86_64": 48 + 40, "EM_AARCH64": 48 + 48}

# take_gil as compilers name it: plain, or a renamed clone (LTO, constant propagation).
_TAKE_GIL = re.compile(r"^take_gil(\.(lto_priv|constprop|isra|part)\.\d+)*$")
_LIBPYTHON = re.compile(r"/libpython3\.(\d+)(t?)\.so[.\d]*$")
_FREE_THREADED_EXE = re.compile(r"/python3\.\d+t$")
_LIBC = re.compile(r"/libc(\.so\.6|-2\.\d+\.so)$")
_LIBPTHREAD = re.compile(r"/libpthread(\.so\.0|-2\.\d+\.so)$")
_COND_FUNCTIONS = (("pthread_cond_signal", "cond_signal"), ("pthread_cond_timedwait", "cond_timedwait"))
# gil.bpf.c's pthread_cond_signal program for each line-table format (ring.LINES_*; 0: no locations).
_COND_SIGNAL = {0: "cond_signal_locations", ring.LINES_LNOTAB: "cond_signal_lnotab",
                ring.LINES_PAIRS: "cond_signal_pairs", ring.LINES_LOCATIONS: "cond_signal_locations"}
_DELETED = " (deleted)"
_MAP_FILES_NEED = ("opening /proc/{pid}/map_files/ needs CAP_SYS_ADMIN, and for a process of another uid "
                   "CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (the directory is mode 0500, its uid's): add them to the "
                   "collector's capabilities (as deploy/kubernetes/collector-daemonset.yaml does) or run it as root")
_CALLER_BYTES = 256


class UnsupportedProcess(Exception):
    """No reliable plan for this process; ``code`` is the protocol error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Probe:
    path: str  # the mapped file itself, /proc/<pid>/map_files/<range>: attaching walks no path of the client's
    offset: int  # file offset of the probed instruction
    handler: str  # BPF function in gil.bpf.c
    bootstrap: bool = False  # detached once the condition variables are learned
    retprobe: bool = False  # on the function's return (a uretprobe), not its entry


@dataclass(frozen=True)
class ProbePlan:
    interpreter: str  # as /proc/<pid>/maps names it
    interpreter_file: str  # the same file as the collector opens it
    probes: tuple[Probe, ...]
    cond_stride: int
    located_by: str  # how take_gil was found
    py_layout: str = ""  # hex of its ring's header.py (ring.PyLayout): where its CPython keeps a location's reads
    no_locations: str = ""  # why its holds carry no location ("" if they do)


@dataclass(frozen=True)
class Mapping:
    """A file mapped by a process (its first mapping)."""

    path: str  # as /proc/<pid>/maps shows it to the collector, " (deleted)" removed
    inode: int
    start: int
    end: int
    offset: int  # file offset mapped at start
    deleted: bool = False

    @property
    def range(self) -> str:
        """Its name in /proc/<pid>/map_files/."""
        return f"{self.start:x}-{self.end:x}"


def mapped_files(pid: int) -> list[Mapping]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UnsupportedProcess(protocol.PROCESS_GONE, f"cannot read /proc/{pid}/maps: {exc.strerror}") from None
    seen: dict[str, Mapping] = {}
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path, deleted = parts[5], parts[5].endswith(_DELETED)
            path = path[: -len(_DELETED)] if deleted else path
            start, end = (int(x, 16) for x in parts[0].split("-"))
            seen.setdefault(path, Mapping(path, int(parts[4]), start, end, int(parts[2], 16), deleted))
    return list(seen.values())


def _inode(path: str) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1


def _host_path(pid: int, mapping: Mapping) -> str:
    """A path in the collector's mount namespace to the very file ``pid`` mapped."""
    in_root = f"/proc/{pid}/root{mapping.path}"  # a container's path, seen through its root
    candidates = [f"/proc/{pid}/map_files/{mapping.range}"]  # the mapped file, whatever the root
    if not mapping.deleted:
        candidates = [in_root, *candidates, mapping.path]  # mapping.path: a chroot in our namespace
    for path in candidates:
        if _inode(path) == mapping.inode:
            return path
    if not mapping.deleted and os.path.exists(in_root):
        return in_root  # overlayfs: stat's inode is not always the one maps shows
    raise UnsupportedProcess(
        protocol.UNSUPPORTED_INTERPRETER,
        f"cannot open {mapping.path}{_DELETED if mapping.deleted else ''} as process {pid} maps it "
        f"(inode {mapping.inode}): {_MAP_FILES_NEED.format(pid=pid)}",
    )


@dataclass(frozen=True)
class Interpreter:
    """A process's interpreter: its mappings, the one holding the interpreter, that file as the
    collector opens it, and its symbols."""

    maps: list[Mapping]
    mapping: Mapping
    file: str
    info: elf.ElfInfo
    free_threaded: bool


def interpreter(pid: int, gil_enabled: bool = True) -> Interpreter:
    """``pid``'s interpreter; UnsupportedProcess (GIL_DISABLED) for a free-threaded build unless
    ``gil_enabled`` (said or read to run with its GIL), before any of its files is opened."""
    maps = mapped_files(pid)
    mapping, free_threaded = _interpreter(pid, maps)
    if free_threaded and not gil_enabled:
        raise UnsupportedProcess(protocol.GIL_DISABLED, without_gil(mapping))
    path = _host_path(pid, mapping)
    try:
        info = elf.load(path)
    except elf.ElfLookupError as exc:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, str(exc)) from None
    return Interpreter(maps, mapping, path, info, free_threaded)


def without_gil(mapping: Mapping) -> str:
    return f"{mapping.path} is a free-threaded build running without a GIL"


def _interpreter(pid: int, maps: list[Mapping]) -> tuple[Mapping, bool]:
    """The mapping holding the interpreter (libpython if loaded, else the executable), and
    whether it is a free-threaded build."""
    for m in maps:
        match = _LIBPYTHON.search(m.path)
        if match:
            return m, bool(match.group(2))
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as exc:
        raise UnsupportedProcess(protocol.PROCESS_GONE, f"cannot read /proc/{pid}/exe: {exc.strerror}") from None
    exe = exe[: -len(_DELETED)] if exe.endswith(_DELETED) else exe
    for m in maps:
        if m.path == exe:
            return m, bool(_FREE_THREADED_EXE.search(exe))
    raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"{exe} is not mapped by process {pid}")


def _take_gil_symbol(info: elf.ElfInfo) -> Optional[int]:
    """take_gil's address from a symbol table: plain, or a renamed clone (never a .cold part)."""
    found = [sym.address for name, sym in info.functions.items() if _TAKE_GIL.match(name)]
    return found[0] if len(found) == 1 else None


def _call_targets(info: elf.ElfInfo, path: str, caller: elf.Symbol) -> set[int]:
    """Targets of the call/jmp rel32 instructions that may start at any byte of ``caller``:
    aligned, executable, unexported addresses that are no PLT stub (x86-64; a byte scan,
    not a decoder, so the callers below cross-check each other)."""
    code = elf.read(path, caller.offset, min(caller.size or _CALLER_BYTES, _CALLER_BYTES))
    exported = {sym.address for sym in info.dynamic.values()}
    targets = set()
    for i in range(len(code) - 4):
        if code[i] in (0xE8, 0xE9):
            target = caller.address + i + 5 + int.from_bytes(code[i + 1 : i + 5], "little", signed=True)
            if target % 16 == 0 and target not in exported and info.executable(target):
                if not _is_plt_stub(elf.read(path, info.file_offset(target), 7)):
                    targets.add(target)
    return targets


def _is_plt_stub(code: bytes) -> bool:
    """``jmp *x(%rip)``, optionally after endbr64 and a bnd prefix: a PLT entry, not a function."""
    if code.startswith(b"\xf3\x0f\x1e\xfa"):
        code = code[4:]
    return code.startswith(b"\xff\x25") or code.startswith(b"\xf2\xff\x25")


def take_gil_from_callers(info: elf.ElfInfo, path: str) -> Optional[int]:
    """take_gil in a stripped build: what ``PyEval_AcquireLock`` tail-calls, confirmed by
    ``PyEval_RestoreThread`` calling it too (<= 3.12) when that narrows it down."""
    if info.machine != "EM_X86_64" or "PyEval_AcquireLock" not in info.dynamic:
        return None
    targets = _call_targets(info, path, info.dynamic["PyEval_AcquireLock"])
    if len(targets) > 1 and "PyEval_RestoreThread" in info.dynamic:
        targets &= _call_targets(info, path, info.dynamic["PyEval_RestoreThread"])
    return targets.pop() if len(targets) == 1 else None


def _debug_file(root: str, info: elf.ElfInfo) -> Optional[elf.ElfInfo]:
    """The separate debug file of a stripped binary, found by build-id (debuginfod layout)."""
    if not info.build_id:
        return None
    path = f"{root}/usr/lib/debug/.build-id/{info.build_id[:2]}/{info.build_id[2:]}.debug"
    try:
        return elf.load(path) if os.path.exists(path) else None
    except elf.ElfLookupError:
        return None


def locate_take_gil(info: elf.ElfInfo, path: str, root: str) -> tuple[int, str]:
    """(file offset of take_gil, how it was found), in order: symbols, build-id debug file, callers."""
    address = _take_gil_symbol(info)
    how = "symbol"
    if address is None:
        debug = _debug_file(root, info)
        address, how = (_take_gil_symbol(debug) if debug else None), "build-id debug file"
    if address is None:
        address, how = take_gil_from_callers(info, path), "PyEval_AcquireLock's call"
    if address is None:
        raise UnsupportedProcess(
            protocol.UNSUPPORTED_INTERPRETER,
            f"{path}: cannot locate take_gil (no symbol, no debug file by build-id, "
            "no recognisable call in PyEval_AcquireLock); install the interpreter's debug symbols",
        )
    return info.file_offset(address), how


def plan(pid: int, gil_enabled: bool = False, found: Optional[Interpreter] = None) -> ProbePlan:
    """The probes that trace ``pid``'s GIL, or UnsupportedProcess saying why there are none.

    ``gil_enabled``: the process says a free-threaded build turned its GIL back on
    (``sys._is_gil_enabled()``); believing it can only mislead that process itself.
    ``found``: its :func:`interpreter`, already checked to run with a GIL.
    """
    found = found or interpreter(pid, gil_enabled)
    maps, interp, interp_path, py = found.maps, found.mapping, found.file, found.info
    c, c_lib = _cond_library(pid, maps)
    stride = COND_STRIDE.get(c.machine)
    if stride is None:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"no condition-variable layout for {c.machine}")
    if "PyEval_SaveThread" not in py.dynamic and not py.has_symtab:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"pid {pid} ({interp.path}) is not a Python process")
    take_gil, how = locate_take_gil(py, interp_path, f"/proc/{pid}/root")
    # Attached through map_files: a FUSE mount on the client's path cannot stall the attach
    # (the files were read by a worker process under a time limit, see planner.py).
    layout, no_locations = pyprocess.py_layout(pid, maps, interp.path, py)
    handlers = {"cond_signal": _COND_SIGNAL[layout.line_format], "cond_timedwait": "cond_timedwait"}
    probes = [Probe(_attach_path(pid, interp), take_gil, "take_gil_entry", bootstrap=True)]
    probes += [Probe(_attach_path(pid, c_lib), c.dynamic[name].offset, handlers[handler])
               for name, handler in _COND_FUNCTIONS]
    return ProbePlan(interp.path, interp_path, tuple(probes), stride, how, bytes(layout).hex(), no_locations)


def plan_parks(pid: int, found: Interpreter) -> ProbePlan:
    """The probes that time the parks of ``pid`` (`otel-gil report` on a free-threaded build
    running without its GIL, of a CPython with a ``pystructs.PARKING`` row; ``found``: its
    :func:`interpreter`): ``_PyParkingLot_Park``'s entry and return."""
    try:
        pyprocess.parking_build(found.mapping.path)
    except pyprocess.Unreadable as exc:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, str(exc)) from None
    park = found.info.dynamic.get("_PyParkingLot_Park") or found.info.functions.get("_PyParkingLot_Park")
    if park is None:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER,
                                 f"{found.mapping.path} has no _PyParkingLot_Park symbol")
    path = _attach_path(pid, found.mapping)
    probes = (Probe(path, park.offset, "park_entry"), Probe(path, park.offset, "park_return", retprobe=True))
    return ProbePlan(found.mapping.path, found.file, probes, 0, "symbol")


def _attach_path(pid: int, mapping: Mapping) -> str:
    """The file ``mapping`` maps, as a magic link the kernel follows without a lookup; refused
    (bcc would then try tracefs, which a container has not, and say only that), why."""
    path = f"/proc/{pid}/map_files/{mapping.range}"
    try:
        os.stat(path)
    except PermissionError as exc:
        raise UnsupportedProcess(protocol.ATTACH_FAILED, f"cannot open {path} ({mapping.path}): {exc.strerror}: "
                                 f"{_MAP_FILES_NEED.format(pid=pid)}") from None
    except OSError:
        pass  # gone or unmapped since: the attach says so
    return path


def _cond_library(pid: int, maps: list[Mapping]) -> tuple[elf.ElfInfo, Mapping]:
    """The library whose ``pthread_cond_*`` the interpreter's calls land in, and its mapping.

    Before glibc 2.34 they live in libpthread.so.0 (libc.so.6 has forwarders to them,
    which the interpreter does not call): probe libpthread where it exports their
    default versions, else libc. Only default versions: glibc also exports
    ``@GLIBC_2.2.5`` compat copies at other addresses, which CPython never calls.
    """
    libc = next((m for m in maps if _LIBC.search(m.path)), None)
    if libc is None:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"process {pid} has no glibc mapped (musl?)")
    libpthread = next((m for m in maps if _LIBPTHREAD.search(m.path)), None)
    for lib in (libpthread, libc) if libpthread else (libc,):
        path = _host_path(pid, lib)
        try:
            info = elf.load(path)
        except elf.ElfLookupError as exc:
            raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, str(exc)) from None
        if all(name in info.dynamic for name, _ in _COND_FUNCTIONS):
            return info, lib
    raise UnsupportedProcess(
        protocol.UNSUPPORTED_INTERPRETER,
        f"{libc.path} exports no default {' / '.join(name for name, _ in _COND_FUNCTIONS)}",
    )
