"""Where to probe in a given process: everything that depends on the interpreter build.

A :class:`ProbePlan` names the uprobes that trace one process's GIL hand-offs.
The plan anchors on libc, whose functions are never inlined into CPython:
``pthread_cond_signal`` on the GIL's ``cond`` is a release (``drop_gil``, even
where LTO inlined it), on its ``switch_cond`` an acquisition (``take_gil`` with
FORCE_SWITCHING, every CPython 3.x); ``pthread_cond_timedwait`` on ``cond``
starts a contended wait. The two addresses differ per process (ASLR) and are
learned by the BPF side from one ``take_gil`` entry (the bootstrap probe).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional

from otel_gil_collector import elf
from otel_gil import protocol

# &gil->switch_cond - &gil->cond: sizeof(pthread_cond_t) + sizeof(pthread_mutex_t).
COND_STRIDE = {"EM_X86_64": 48 + 40, "EM_AARCH64": 48 + 48}

# take_gil as compilers name it: plain, or a renamed clone (LTO, constant propagation).
_TAKE_GIL = re.compile(r"^take_gil(\.(lto_priv|constprop|isra|part)\.\d+)*$")
_LIBPYTHON = re.compile(r"/libpython3\.(\d+)(t?)\.so[.\d]*$")
_FREE_THREADED_EXE = re.compile(r"/python3\.\d+t$")
_LIBC = re.compile(r"/libc(\.so\.6|-2\.\d+\.so)$")
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


@dataclass(frozen=True)
class ProbePlan:
    interpreter: str  # path inside the process
    probes: tuple[Probe, ...]
    cond_stride: int
    located_by: str  # how take_gil was found


@dataclass(frozen=True)
class _Mapping:
    path: str
    inode: int
    range: str  # start-end of its first mapping, as /proc/<pid>/maps shows it


def _mapped_files(pid: int) -> list[_Mapping]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UnsupportedProcess(protocol.PROCESS_GONE, f"cannot read /proc/{pid}/maps: {exc.strerror}") from None
    seen: dict[str, _Mapping] = {}
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            seen.setdefault(parts[5], _Mapping(parts[5], int(parts[4]), parts[0]))
    return list(seen.values())


def _host_path(pid: int, mapping: _Mapping) -> str:
    if mapping.path.endswith(" (deleted)"):
        raise UnsupportedProcess(
            protocol.UNSUPPORTED_INTERPRETER,
            f"{mapping.path}: the file was replaced on disk since the process started; restart it",
        )
    return f"/proc/{pid}/root{mapping.path}"


def _mapped_file(pid: int, mapping: _Mapping) -> str:
    """The file ``mapping`` maps, as a magic link: a uprobe attached through it resolves no
    component of the client's path (a FUSE mount there could stall the lookup)."""
    start, end = (int(bound, 16) for bound in mapping.range.split("-"))
    return f"/proc/{pid}/map_files/{start:x}-{end:x}"  # maps pads to 8 digits, map_files does not


def _interpreter(pid: int, maps: list[_Mapping], gil_enabled: bool) -> _Mapping:
    """The mapping holding the interpreter: libpython if loaded, else the executable."""
    for m in maps:
        match = _LIBPYTHON.search(m.path)
        if match:
            if match.group(2) and not gil_enabled:
                raise UnsupportedProcess(
                    protocol.GIL_DISABLED, f"{m.path} is a free-threaded build running without a GIL"
                )
            return m
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as exc:
        raise UnsupportedProcess(protocol.PROCESS_GONE, f"cannot read /proc/{pid}/exe: {exc.strerror}") from None
    for m in maps:
        if m.path == exe:
            if _FREE_THREADED_EXE.search(exe) and not gil_enabled:
                raise UnsupportedProcess(protocol.GIL_DISABLED, f"{exe} is a free-threaded build running without a GIL")
            return m
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


def plan(pid: int, gil_enabled: bool = False) -> ProbePlan:
    """The probes that trace ``pid``'s GIL, or UnsupportedProcess saying why there are none.

    ``gil_enabled``: the process says a free-threaded build turned its GIL back on
    (``sys._is_gil_enabled()``); believing it can only mislead that process itself.
    """
    maps = _mapped_files(pid)
    interp = _interpreter(pid, maps, gil_enabled)
    libc = next((m for m in maps if _LIBC.search(m.path)), None)
    if libc is None:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"process {pid} has no glibc mapped (musl?)")
    interp_path, libc_path = _host_path(pid, interp), _host_path(pid, libc)
    try:
        py, c = elf.load(interp_path), elf.load(libc_path)
    except elf.ElfLookupError as exc:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, str(exc)) from None
    stride = COND_STRIDE.get(c.machine)
    if stride is None:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"no condition-variable layout for {c.machine}")
    if "PyEval_SaveThread" not in py.dynamic and not py.has_symtab:
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"pid {pid} ({interp.path}) is not a Python process")
    take_gil, how = locate_take_gil(py, interp_path, f"/proc/{pid}/root")
    probes = [Probe(_mapped_file(pid, interp), take_gil, "take_gil_entry", bootstrap=True)]
    for name, handler in (("pthread_cond_signal", "cond_signal"), ("pthread_cond_timedwait", "cond_timedwait")):
        sym = c.dynamic.get(name)
        if sym is None:
            raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"{libc.path} exports no default {name}")
        probes.append(Probe(_mapped_file(pid, libc), sym.offset, handler))
    return ProbePlan(interp.path, tuple(probes), stride, how)
