"""The span hooks of otel_gil.spans in C (otel_gil/_fastspan.c and the files it lists)."""

import contextvars
from typing import Any, Callable, NamedTuple, Optional, Union

SLOT_SIZE: int
LAYOUT_VERSION: int
CLOCK_SLACK_NS: int

# (wait_ns, hold_ns, acquisitions, convoy_waits, long_waits)
Counters = tuple[int, int, int, int, int]

class Own(NamedTuple):
    """What a span's own code did on the GIL: spans.Own's fields, in its order (a struct
    sequence in C; tests/unit/test_native_contract.py checks the three agree)."""

    hold_home: int
    acquisitions_home: int
    wait_else: int
    hold_else: int
    acquisitions_else: int
    convoy_else: int
    threads_else: int
    switched: bool
    unseen: bool
    broken: bool
    untracked: bool

class Start:
    """GIL counters of a thread when a span started (read by the C and Python hooks alike)."""

    registration: Any
    ring: Any
    metrics: Any
    status: str
    generation: int
    tid: int
    mono_ns: int
    wall_ns: int
    @property
    def counters(self) -> Counters: ...
    @property
    def own(self) -> Optional[Own]: ...

class Hooks:
    """The span hooks: spans.GilSpanProcessor's fast path."""

    enabled: bool
    def __init__(self, registration: Any, metrics: Any, ok: str, on_start: Callable[[Any], None],
                 end: Callable[[Callable[..., Any], Any, tuple, dict], Any],
                 server: Callable[[Any, Any, float], None], server_kind: Any, every: bool = False) -> None: ...
    def start_method(self, original: Callable[..., Any], scope: Any, /) -> Callable[..., Any]: ...
    def end_method(self, original: Callable[..., Any], /) -> Callable[..., Any]: ...

class RatioCounter:
    """metrics.WaitRatios.record in C."""

    def __init__(self, table: dict[str, list[Union[int, float]]], bounds: tuple[float, ...], max_routes: int,
                 other: str) -> None: ...
    def __call__(self, ratio: float, route: str, /) -> None: ...

def thread_contexts() -> dict[int, contextvars.Context]: ...
def track_contexts(hooks: Hooks, var: contextvars.ContextVar, key: str, /) -> None: ...
def untrack_contexts() -> None: ...
def hook_loop_modules() -> None: ...
def module_switches() -> dict[str, dict[str, Any]]: ...
def held_by(tid: int, start_ns: int, end_ns: int, /) -> Optional[tuple[()] | tuple[str, str]]: ...
