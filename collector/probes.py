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

from collector import elf
from otel_gil import protocol

# &gil->switch_cond - &gil->cond: sizeof(pthread_cond_t) + sizeof(pthread_mutex_t).
COND_STRIDE = {"EM_X86_64": 48 + 40, "EM_AARCH64": 48 + 48}

# take_gil as compilers name it: plain, or a renamed clone (LTO, constant propagation).
_TAKE_GIL = re.compile(r"^take_gil(\.(lto_priv|constprop|isra|part)\.\d+)*$")
_LIBPYTHON = re.compile(r"/libpython3\.(\d+)(t?)\.so[.\d]*$")
_LIBC = re.compile(r"/libc(\.so\.6|-2\.\d+\.so)$")


class UnsupportedProcess(Exception):
    """No reliable plan for this process; ``code`` is the protocol error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Probe:
    path: str  # as the collector opens it: /proc/<pid>/root/<path in the process>
    offset: int  # file offset of the probed instruction
    handler: str  # BPF function in gil.bpf.c
    bootstrap: bool = False  # detached once the condition variables are learned


@dataclass(frozen=True)
class ProbePlan:
    interpreter: str  # path inside the process
    probes: tuple[Probe, ...]
    cond_stride: int


@dataclass(frozen=True)
class _Mapping:
    path: str
    inode: int


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
            seen.setdefault(parts[5], _Mapping(parts[5], int(parts[4])))
    return list(seen.values())


def _host_path(pid: int, mapping: _Mapping) -> str:
    if mapping.path.endswith(" (deleted)"):
        raise UnsupportedProcess(
            protocol.UNSUPPORTED_INTERPRETER,
            f"{mapping.path}: the file was replaced on disk since the process started; restart it",
        )
    return f"/proc/{pid}/root{mapping.path}"


def _interpreter(pid: int, maps: list[_Mapping]) -> _Mapping:
    for m in maps:
        match = _LIBPYTHON.search(m.path)
        if match:
            if match.group(2):
                raise UnsupportedProcess(
                    protocol.GIL_DISABLED, f"{m.path} is a free-threaded build (no GIL to measure)"
                )
            return m
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as exc:
        raise UnsupportedProcess(protocol.PROCESS_GONE, f"cannot read /proc/{pid}/exe: {exc.strerror}") from None
    for m in maps:
        if m.path == exe:
            return m
    raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"{exe} is not mapped by process {pid}")


def _take_gil(info: elf.ElfInfo, where: str) -> elf.Symbol:
    found = [sym for name, sym in info.functions.items() if _TAKE_GIL.match(name)]
    if len(found) != 1:
        why = "no take_gil symbol" if not found else f"{len(found)} take_gil candidates"
        hint = "" if info.has_symtab else " (the binary is stripped: no .symtab)"
        raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"{where}: {why}{hint}")
    return found[0]


def plan(pid: int) -> ProbePlan:
    """The probes that trace ``pid``'s GIL, or UnsupportedProcess saying why there are none."""
    maps = _mapped_files(pid)
    interp = _interpreter(pid, maps)
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
    take_gil = _take_gil(py, interp.path)
    probes = [Probe(interp_path, take_gil.offset, "take_gil_entry", bootstrap=True)]
    for name, handler in (("pthread_cond_signal", "cond_signal"), ("pthread_cond_timedwait", "cond_timedwait")):
        sym = c.dynamic.get(name)
        if sym is None:
            raise UnsupportedProcess(protocol.UNSUPPORTED_INTERPRETER, f"{libc.path} exports no default {name}")
        probes.append(Probe(libc_path, sym.offset, handler))
    return ProbePlan(interp.path, tuple(probes), stride)
