"""Our wrappers of other libraries' functions, in a chain with anyone else's.

Two libraries may wrap one function in either order and undo in any order (contrib's
``unwrap`` removes the outermost wrapper, whoever put it there): :func:`wrap` puts ours on
once, :func:`unwrap` takes out only ours, wherever it is in the chain; :func:`remove` does so
for an object of ours that is no wrapt wrapper (the C span hooks, ``_fastspan.SpanMethod``).
"""

from __future__ import annotations

from typing import Callable, Optional

import wrapt

_PROXY = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)  # wrapt 2, wrapt 1
_WRAPPERS = (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)


def _find(owner: type, name: str, is_ours: Callable[[object], bool]) -> tuple[Optional[object], Optional[object]]:
    """(the wrapper just outside ours or None, ours) in ``owner.name``'s chain of wrappers;
    (None, None) if ours is not in it (never put there, or removed by another)."""
    outer, current = None, owner.__dict__.get(name)
    while current is not None:
        if is_ours(current):
            return outer, current
        outer, current = current, getattr(current, "__wrapped__", None)
    return None, None


def find(owner: type, name: str, wrapper: Callable) -> tuple[Optional[object], Optional[object]]:
    """_find for our wrapt ``wrapper``."""
    # type(), not isinstance(): a proxy of ours would pass for ours. Bound: as the threading
    # instrumentation's unwrap leaves ours when it took its own from outside it.
    return _find(owner, name, lambda current: issubclass(type(current), _WRAPPERS) and current._self_wrapper is wrapper)


def wrap(owner: type, name: str, wrapper: Callable) -> None:
    """Put ``wrapper`` (a wrapt wrapper) around ``owner.name``, unless it is in the chain already."""
    if find(owner, name, wrapper)[1] is None:
        wrapt.wrap_function_wrapper(owner, name, wrapper)


def _take_out(owner: type, name: str, outer: Optional[object], ours: Optional[object]) -> None:
    if outer is None and ours is not None:
        setattr(owner, name, ours.__wrapped__)
    elif issubclass(type(outer), _PROXY):
        outer.__wrapped__ = ours.__wrapped__


def unwrap(owner: type, name: str, wrapper: Callable) -> None:
    """Take ``wrapper`` out of ``owner.name``'s chain, leaving other libraries' wrappers as
    they are (one that cannot be re-pointed keeps ours: ``wrapper`` must then pass through)."""
    _take_out(owner, name, *find(owner, name, wrapper))


def remove(owner: type, name: str, ours: object) -> None:
    """unwrap for an object of ours that is no wrapt wrapper (``ours.__wrapped__``: what it replaced),
    found by identity (it must then pass through where it stays)."""
    _take_out(owner, name, *_find(owner, name, lambda current: current is ours))
