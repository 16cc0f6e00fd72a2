"""Names of this process's threads by native id, for spans and metrics alike."""

from __future__ import annotations

import threading
from typing import Optional


def names() -> dict[int, str]:
    """``threading`` names of the live Python threads, by native (kernel) thread id."""
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


def name(tid: int, known: dict[int, str]) -> Optional[str]:
    """The thread's ``threading`` name, else its kernel name (/proc), else None."""
    found = known.get(tid)
    if found is None:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                found = f.read().strip() or None
        except OSError:
            pass
    return found
