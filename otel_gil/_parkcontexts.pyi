"""Free-threaded builds: each span's own parked time, charged at every switch of context
(otel_gil/park_contexts.c, switch_hooks.h)."""

import contextvars
from typing import Any, Optional

# end()'s answer: (parked ns by kind, parks, its long parks [(start_ns, end_ns, kind, type)], long parks
# dropped, ns since the span started, ns parked on its home thread, on other threads, how many others
# (-1: more than 8))
Figures = tuple[tuple[int, int, int, int, int], int, list[tuple[int, int, int, bytes]], int, int, int, int, int]

class Parked:
    """One span's own parks: charged at each switch of context on every thread its code ran on."""

def track(address: int, nslots: int, var: contextvars.ContextVar, key: str, /) -> None:
    """Charge each span its own parks at every switch of context, from the park ring at address."""

def untrack() -> None: ...
def start(span: Any, span_id: int, parent_id: int, /) -> Optional[Parked]:
    """A span starts on this thread: its Parked (also its ``_otel_gil_parked``), None when not tracking."""

def end(parked: Parked, /) -> Optional[Figures]:
    """Its span ends on this thread: its figures, None where they are unknown."""
