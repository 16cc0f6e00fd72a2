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
def locate_self(layout: bytes, /) -> bytes: ...
def set_layout(layout: bytes, /) -> None: ...
def got_entries() -> list[GotEntry]: ...
def forks() -> int: ...
def object() -> str: ...
