"""The few bpf(2) commands bcc does not wrap: frozen mmapable arrays, and map ids."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
from typing import Callable

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_MAP_CREATE = 0
BPF_MAP_GET_FD_BY_ID = 14
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_FREEZE = 22
BPF_MAP_TYPE_ARRAY = 2
BPF_F_MMAPABLE = 1 << 10

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MapCreate(ctypes.Structure):
    _fields_ = [
        ("map_type", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("inner_map_fd", ctypes.c_uint32),
        ("numa_node", ctypes.c_uint32),
        ("map_name", ctypes.c_char * 16),
        ("pad", ctypes.c_uint8 * 64),
    ]


class _MapFd(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint8 * 60)]


class _MapById(ctypes.Structure):
    _fields_ = [("map_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32),
                ("pad", ctypes.c_uint8 * 52)]


class _InfoByFd(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64),
                ("pad", ctypes.c_uint8 * 48)]


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"bpf(2) syscall number unknown on {platform.machine()}")
    ret = _libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf cmd {cmd}: {os.strerror(err)}")
    return ret


class MmapableArray:
    """A BPF_F_MMAPABLE array, initialised through ``init(address)`` and then frozen.

    Frozen, the map is read-only for every process (no PROT_WRITE mapping, no
    update syscall) while BPF programs still write it: so its fd can be handed
    to a client that may only read it. (A read-only fd would not do: the kernel
    refuses shared mappings of BPF maps through read-only fds.)
    """

    def __init__(self, name: str, value_size: int, max_entries: int, init: Callable[[int], None]) -> None:
        attr = _MapCreate(
            map_type=BPF_MAP_TYPE_ARRAY,
            key_size=4,
            value_size=value_size,
            max_entries=max_entries,
            map_flags=BPF_F_MMAPABLE,
            map_name=name.encode()[:15],
        )
        self.fd = _bpf(BPF_MAP_CREATE, attr)
        page = mmap.PAGESIZE
        self.size = (value_size * max_entries + page - 1) // page * page
        try:
            with mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as rw:
                view = ctypes.c_char.from_buffer(rw)
                init(ctypes.addressof(view))
                del view
            _bpf(BPF_MAP_FREEZE, _MapFd(map_fd=self.fd))
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)


def map_id(fd: int) -> int:
    """The kernel's id of the BPF map behind ``fd`` (stable while the map exists)."""
    info = (ctypes.c_uint32 * 2)()  # struct bpf_map_info starts with type, id
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoByFd(bpf_fd=fd, info_len=ctypes.sizeof(info), info=ctypes.addressof(info)))
    return info[1]


def map_alive(map_id: int) -> bool:
    """Whether a BPF map with this id still exists: some process still holds or maps it.
    True unless the kernel says there is none (out of fds, say, it is counted as alive)."""
    try:
        os.close(_bpf(BPF_MAP_GET_FD_BY_ID, _MapById(map_id=map_id)))
        return True
    except OSError as exc:
        return exc.errno != errno.ENOENT
