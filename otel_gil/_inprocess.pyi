"""The in-process writer of the GIL slot layout (otel_gil/_inprocess.c, got_patch.c)."""

from typing import TypedDict

SLOT_SIZE: int
LAYOUT_VERSION: int

class Unsupported(Exception):
    """This interpreter cannot be traced in-process; the message says why."""

class GotEntry(TypedDict):
    symbol: str
    address: int
    value: int
    original: int
    relro: bool

def install(nslots: int, long_wait_ns: int, convoy_ns: int) -> tuple[int, int]:
    """Hook the GIL's hand-offs (GIL held): the ring's (address, size)."""

def uninstall() -> None: ...
def install_parks(nslots: int, long_wait_ns: int, convoy_ns: int, entry_addr: int, tstate_state: int, ob_mutex: int,
                  ob_type: int, lock_mutex: int, tp_name: int, stw_runtime: int, stw_interp: int, runtime_size: int,
                  interp_size: int, lock_types: tuple[int, int], gil_enabled: int) -> tuple[int, int]:
    """Free-threaded builds: time each park of libpython's sem_* calls by kind (the ring's address, size)."""

def uninstall_parks() -> None: ...
def locate_self(layout: bytes, /) -> bytes: ...
def set_layout(layout: bytes, /) -> None: ...
def got_entries() -> list[GotEntry]: ...
def forks() -> int: ...
def object() -> str: ...
