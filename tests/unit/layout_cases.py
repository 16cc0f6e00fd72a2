"""The cases of test_cpython_layouts.py, run by each interpreter of the matrix against
``layout_checks.c`` built for it: ``python layout_cases.py MODULE`` prints {case: None or the
failure} as JSON. Each read is made twice (the first fills the cache, the second uses it) and
must give what ``getattr`` gives; ``fast`` also asserts the second went through the type's
layout, where the interpreter has one the hooks read (3.11-3.13)."""

from __future__ import annotations

import importlib.util
import json
import sys
import traceback

checks = None  # layout_checks, loaded by main()


def same(obj, name: str) -> None:
    """lookup(obj, name), twice, is getattr(obj, name, ABSENT)."""
    name = sys.intern(name)
    expected = getattr(obj, name, checks.ABSENT)
    for _ in range(2):
        got = checks.lookup(obj, name)
        assert got is expected or (got == expected and expected is not checks.ABSENT), (type(obj).__name__, name, got)


def fast(obj, name: str, through_layout: bool = True) -> None:
    """same(obj, name), the second read through the type's layout (where the interpreter has one) or not."""
    same(obj, name)
    cached = checks.cached(obj, sys.intern(name))
    assert cached == (through_layout and bool(checks.KNOWN_LAYOUT)), (type(obj).__name__, name, cached)


def span_type(**attributes):
    """A new class whose instances start with these attributes, set in this order."""
    def __init__(self):
        for name, value in attributes.items():
            setattr(self, name, value)

    return type("Span", (), {"__init__": __init__})


def case_set_changed_and_deleted_attributes_read_as_getattr_reads_them():
    class Span:
        def __init__(self):
            self._end_time = None
            self._name = "op"

    a, b = Span(), Span()
    for obj in (a, b):
        fast(obj, "_end_time")
        fast(obj, "_name")
        fast(obj, "_missing")
    a._end_time = 5
    fast(a, "_end_time")
    fast(b, "_end_time")
    del a._name
    same(a, "_name")
    same(b, "_late")
    b._late = 1  # a key no instance had when it was last looked for
    same(b, "_late")
    same(a, "_late")


def case_many_attributes_each_read_from_its_own_slot():
    class Span:
        def __init__(self, i):
            for k in range(12):
                setattr(self, f"_a{k}", (i, k))

    spans = [Span(i) for i in range(5)]
    for _ in range(2):
        for span in spans:
            for k in range(12):
                fast(span, f"_a{k}")


def case_a_subclass_with_attributes_of_its_own_in_another_order():
    class Span:
        def __init__(self):
            self._start_time = 1
            self._end_time = None

    class Sub(Span):
        def __init__(self):
            self._extra = "first"  # the subclass's keys: _start_time at another index than Span's
            super().__init__()
            self._more = 2

    s, c = Span(), Sub()
    for _ in range(2):
        for obj in (s, c):
            fast(obj, "_start_time")
            fast(obj, "_end_time")
        fast(c, "_extra")
        fast(c, "_more")
        fast(s, "_extra")  # absent on Span's instances


def case_what_the_type_gains_later_shadows_or_stands_in_as_getattr_says():
    Span = span_type(_kind="internal")
    s = Span()
    fast(s, "_kind")
    fast(s, "_absent")
    Span._kind = property(lambda self: "shadowed")  # a data descriptor: the instance's value no longer counts
    fast(s, "_kind", through_layout=False)
    del Span._kind
    fast(s, "_kind")
    Span._absent = "class"  # a plain class attribute: found where the instance has none
    fast(s, "_absent", through_layout=False)
    del Span._absent
    fast(s, "_absent")
    Span.__getattr__ = lambda self, name: f"from __getattr__ {name}"
    fast(s, "_absent", through_layout=False)
    del Span.__getattr__
    fast(s, "_absent")


def case_a_type_changed_mid_run_is_read_again():
    Span = span_type(_name="op")
    s = Span()
    fast(s, "_name")
    for i in range(3):  # each change gives the type another version tag: the cached index is taken again
        setattr(Span, f"unrelated{i}", i)
        fast(s, "_name")
    Span.__init__ = lambda self: setattr(self, "_other", 1)  # its new instances' keys grow
    t = Span()
    fast(t, "_other")
    fast(t, "_name")
    fast(s, "_other")


def case_an_instance_dict_made_by_vars_or_replaced():
    class Span:
        def __init__(self):
            self._start_time = 1
            self._name = "op"

    class Child(Span):
        pass

    s, c = Span(), Child()
    fast(s, "_start_time")
    fast(c, "_start_time")
    d = vars(s)  # 3.13: a dict sharing the inline values (read there); 3.11, 3.12: the values move into it
    shared = sys.version_info[:2] == (3, 13)
    fast(s, "_start_time", through_layout=shared)
    d["_start_time"] = 2
    fast(s, "_start_time", through_layout=shared)
    s._name = "renamed"
    fast(s, "_name", through_layout=shared)
    d["_new"] = 3  # a key the type's shared keys take
    same(s, "_new")
    del d["_name"]
    same(s, "_name")
    d[1] = "not a str key"  # the dict leaves the shared keys: 3.13's values are no longer valid
    fast(s, "_start_time", through_layout=False)
    same(s, "_new")
    c.__dict__ = {"_other": 3}
    fast(c, "_start_time", through_layout=False)
    fast(c, "_other", through_layout=False)
    fast(Child(), "_start_time")  # another instance of the type still has its values


def case_stores_leave_what_setattr_leaves():
    class Span:
        def __init__(self):
            self._name = "op"

    name = sys.intern("_otel_gil_start")
    first, second = Span(), Span()
    for span in (first, second, Span()):  # the first store adds the name to the type's keys
        same(span, name)
        checks.store(span, name, 1)
        checks.store(span, sys.intern("_late"), 2)
        checks.store(span, name, 3)  # replaced: stays where it was in the order
        assert vars(span) == {"_name": "op", name: 3, "_late": 2} and list(vars(span)) == ["_name", name, "_late"]
    later = sys.intern("_later")
    checks.store(Span(), later, 0)  # the type's keys take it
    same(first, later)  # (its index cached)
    made = vars(first)  # 3.13: a dict of the values, which must see the stores
    checks.store(first, name, 7)
    checks.store(first, later, 8)
    assert made == {"_name": "op", name: 7, "_late": 2, later: 8} and len(made) == 4, made
    assert list(made) == ["_name", name, "_late", later] and first._later == 8
    Span._otel_gil_start = property(lambda self: "class", lambda self, value: setattr(self, "_set", value))
    checks.store(second, name, 4)  # a data descriptor takes the store
    assert second._set == 4 and second._otel_gil_start == "class"
    del Span._otel_gil_start
    Span.__setattr__ = lambda self, key, value: object.__setattr__(self, key, value * 10)
    checks.store(first, name, 5)
    same(first, name)
    assert first._otel_gil_start == 50

    class Guarded:  # its own __setattr__ from the start
        def __setattr__(self, key, value):
            object.__setattr__(self, key, -value)

    guarded = Guarded()
    for _ in range(2):
        checks.store(guarded, name, 6)
        same(guarded, name)
        assert guarded._otel_gil_start == -6


def case_more_types_and_names_than_the_cache_holds():
    types = [type(f"T{i}", (), {}) for i in range(300)]
    objs = []
    for i, t in enumerate(types):
        obj = t()
        obj.a, obj.b = i, -i
        objs.append(obj)
    for _ in range(2):
        for obj in objs:
            same(obj, "a")
            same(obj, "b")
            same(obj, "c")


def together(obj, names: tuple) -> None:
    """fields(obj, names), twice (the first refills the site, the second may read through it), is getattr's."""
    names = tuple(sys.intern(name) for name in names)
    expected = tuple(getattr(obj, name, checks.ABSENT) for name in names)
    for _ in range(2):
        assert checks.fields(obj, names) == expected, (type(obj).__name__, names, checks.fields(obj, names))


def case_several_names_read_together_as_getattr_reads_them():
    """One call site reading several names (fields_read): types taking turns at it, their names at
    other indices, names absent or shadowed by the class; and a read through the same site by
    Python code one of its own lookups runs (a property's getter) while the site is refilled."""
    Span = span_type(_end_time=None, _name="op", _kind="server")
    Other = span_type(_pad=0, _kind="client", _name="other", _end_time=5)  # the same names at other indices
    s, o = Span(), Other()
    for _ in range(2):
        together(s, ("_end_time", "_name", "_kind"))
        together(o, ("_end_time", "_name", "_kind"))
        together(s, ("_name", "_missing"))
    s._name = "renamed"
    together(s, ("_end_time", "_name", "_kind"))
    inner = []

    class Reading:
        def __init__(self):
            self._kind, self._name = "reading", "outer"

        @property
        def _end_time(self):  # read through the site, as another span's end would be, mid-refill
            inner.append(checks.fields(o, (sys.intern("_end_time"), sys.intern("_name"), sys.intern("_kind"))))
            return None

    together(o, ("_end_time", "_name", "_kind"))  # the site holds Other's record
    outer = checks.fields(Reading(), (sys.intern("_kind"), sys.intern("_end_time"), sys.intern("_name")))
    assert outer == ("reading", None, "outer"), outer
    assert inner == [(5, "other", "client")], inner


def case_an_empty_dict_filled_from_a_model_is_what_inserting_in_order_leaves():
    keys = tuple(sys.intern(k) for k in ("thread.name", "thread.id", "gil.wait_ms", "gil.hold_ms", "gil.wait_ratio"))
    model = {}
    for round, values in enumerate([("a", 1, 0.5, 1.5, 0.1), ("b", 2, 0.0, 2.5, 0.0), ("c", 3, 9.0, 0.25, 0.9)]):
        target = {}
        filled = checks.fill_empty(target, model, keys, values)
        assert filled == (1 if checks.KNOWN_LAYOUT else 0), (round, filled)  # 0: no shortcut, the hooks insert them
        if filled == 0:
            assert target == {}
            continue
        assert list(target.items()) == list(zip(keys, values)), round
        target["later"] = 1  # a dict of its own: the model is not touched
        assert "later" not in model
    other = tuple(reversed(keys))  # another set (order) of keys than the model's: the caller inserts
    assert checks.fill_empty({}, model, other, tuple(range(5))) == 0


def case_a_locks_state_read_in_place_is_what_locked_says():
    import _thread
    import threading

    assert checks.lock_probe(_thread.allocate_lock()) == checks.KNOWN_LAYOUT
    locks = [threading.Lock() for _ in range(3)]
    for round in range(2):
        for i, lock in enumerate(locks):
            if (i + round) % 2:
                lock.acquire()
            state = checks.lock_state(lock)
            assert state == (int(lock.locked()) if checks.KNOWN_LAYOUT else -1), (round, i, state)
            if lock.locked():
                lock.release()
    taken = threading.Event()
    lock = threading.Lock()
    threading.Thread(target=lambda: (lock.acquire(), taken.set())).start()  # held by another thread
    assert taken.wait(10)
    assert checks.lock_state(lock) == (1 if checks.KNOWN_LAYOUT else -1)
    lock.release()
    assert checks.lock_state(lock) == (0 if checks.KNOWN_LAYOUT else -1)
    assert checks.lock_state(threading.RLock()) == -1  # another type: the caller asks locked()


def case_an_ints_value_read_from_its_digits_is_what_pylong_aslong_gives():
    class Int(int):
        pass

    edges = [0, 1, 7, 2**30 - 1, 2**30, 2**60 - 1, 2**60, 2**62, 2**63 - 1, 1_800_000_000_000_000_000]
    for value in [*edges, *(-v for v in edges), -(2**63), True, Int(5), 10**30]:
        fits = isinstance(value, int) and -(2**63) <= value < 2**63
        expected = int(value) if fits else checks.ABSENT
        assert checks.long_value(value) == expected, value
    for other in (2**63, -(2**63) - 1, 2**64, None, "1"):
        assert checks.long_value(other) is checks.ABSENT, other


def main() -> None:
    global checks
    spec = importlib.util.spec_from_file_location("layout_checks", sys.argv[1])
    checks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checks)
    outcome = {}
    for name, case in list(globals().items()):
        if name.startswith("case_"):
            try:
                case()
                outcome[name] = None
            except Exception:  # noqa: BLE001  (reported, and the test fails on it)
                outcome[name] = traceback.format_exc()
    print(json.dumps({"known_layout": checks.KNOWN_LAYOUT, "cases": outcome}))


if __name__ == "__main__":
    main()
