"""Whether this process may open uprobes: the kernel decides at perf_event_open(2), and the
capabilities held do not say. Measured on Linux 6.18: with CAP_BPF, CAP_PERFMON and
CAP_SYS_PTRACE a software event opens and a uprobe is refused (EACCES); with CAP_SYS_ADMIN
it opens. bcc then falls back to tracefs's uprobe_events, which a container rarely has."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
from typing import Optional

from otel_gil_collector import elf

_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
_UPROBE_TYPE = "/sys/bus/event_source/devices/uprobe/type"
_PERF_FLAG_FD_CLOEXEC = 1 << 3
_DISABLED = 1  # perf_event_attr.disabled: the probe records nothing


class _Attr(ctypes.Structure):
    """perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1)."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("uprobe_path", ctypes.c_uint64), ("probe_offset", ctypes.c_uint64)]


def refusal() -> Optional[int]:
    """The errno with which the kernel refuses this process a uprobe (on one of its own
    executable's functions, in this process only, disabled), or None if it opens one (or
    there is nothing to try it on: the caller's own attach then says what fails)."""
    nr = _SYS_PERF_EVENT_OPEN.get(platform.machine())
    try:
        with open(_UPROBE_TYPE) as f:
            pmu = int(f.read())
        path = os.path.realpath("/proc/self/exe")
        info = elf.load(path)
    except (OSError, ValueError, elf.ElfLookupError):
        return None
    functions = info.dynamic or info.functions
    if nr is None or not functions:
        return None
    target = min(functions.values(), key=lambda s: s.offset)
    name = ctypes.create_string_buffer(path.encode())
    attr = _Attr(type=pmu, size=ctypes.sizeof(_Attr), sample_period=1, flags=_DISABLED,
                 uprobe_path=ctypes.addressof(name), probe_offset=target.offset)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(nr, ctypes.byref(attr), os.getpid(), -1, -1, _PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        return err if err in (errno.EACCES, errno.EPERM) else None
    os.close(fd)
    return None
