"""The C span hooks' shortcuts through CPython's layouts (``otel_gil/cpython_layouts.c``) against
the generic paths. Attribute reads and stores against ``getattr`` and ``setattr``: where CPython keeps an instance's attributes in its type's shared keys (3.11) they
are read and written there by an index cached per (type, name); whatever changes the type or the
instance after that (a property, class attribute, ``__getattr__`` or ``__setattr__`` added, the
instance's own dict, attributes deleted, more types than the cache holds) must give what
``getattr`` and ``setattr`` give. An empty dict filled from a model: as inserting the keys in order
would leave it, whatever it held before. Each read is made twice (the first fills the
cache, the second uses it) through ``layout_checks.c``, a module compiled here with it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    built = tmp_path_factory.mktemp("layouts") / f"layout_checks{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{sysconfig.get_paths()['include']}",
                    f"-I{ROOT / 'otel_gil'}", "-o", str(built), str(HERE / "layout_checks.c"),
                    str(ROOT / "otel_gil" / "cpython_layouts.c")], check=True)
    spec = importlib.util.spec_from_file_location("layout_checks", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same(checks, obj, name: str) -> None:
    """lookup(obj, name), twice, is getattr(obj, name, ABSENT)."""
    name = sys.intern(name)
    expected = getattr(obj, name, checks.ABSENT)
    for _ in range(2):
        got = checks.lookup(obj, name)
        assert got is expected or (got == expected and expected is not checks.ABSENT), (type(obj).__name__, name, got)


def test_set_changed_and_deleted_attributes_read_as_getattr_reads_them(checks):
    class Span:
        def __init__(self):
            self._end_time = None
            self._name = "op"

    a, b = Span(), Span()
    for obj in (a, b):
        same(checks, obj, "_end_time")
        same(checks, obj, "_name")
        same(checks, obj, "_missing")
    a._end_time = 5
    same(checks, a, "_end_time")
    same(checks, b, "_end_time")
    del a._name
    same(checks, a, "_name")
    same(checks, b, "_late")
    b._late = 1  # a key no instance had when it was last looked for
    same(checks, b, "_late")
    same(checks, a, "_late")


def test_what_the_type_gains_later_shadows_or_stands_in_as_getattr_says(checks):
    class Span:
        def __init__(self):
            self._kind = "internal"

    s = Span()
    same(checks, s, "_kind")
    same(checks, s, "_absent")
    Span._kind = property(lambda self: "shadowed")  # a data descriptor: the instance's value no longer counts
    same(checks, s, "_kind")
    del Span._kind
    same(checks, s, "_kind")
    Span._absent = "class"  # a plain class attribute: found where the instance has none
    same(checks, s, "_absent")
    del Span._absent
    same(checks, s, "_absent")
    Span.__getattr__ = lambda self, name: f"from __getattr__ {name}"
    same(checks, s, "_absent")
    del Span.__getattr__
    same(checks, s, "_absent")


def test_an_instance_with_a_dict_of_its_own_a_subclass_and_a_replaced_dict(checks):
    class Span:
        def __init__(self):
            self._start_time = 1

    class Child(Span):
        pass

    s, c = Span(), Child()
    same(checks, s, "_start_time")
    same(checks, c, "_start_time")
    vars(s)  # its values move into a dict of its own
    s._start_time = 2
    same(checks, s, "_start_time")
    c.__dict__ = {"_other": 3}
    same(checks, c, "_start_time")
    same(checks, c, "_other")


def test_stores_leave_what_setattr_leaves(checks):
    class Span:
        def __init__(self):
            self._name = "op"

    name = sys.intern("_otel_gil_start")
    first, second = Span(), Span()
    for span in (first, second, Span()):  # the first store adds the name to the type's keys
        same(checks, span, name)
        checks.store(span, name, 1)
        checks.store(span, sys.intern("_late"), 2)
        checks.store(span, name, 3)  # replaced: stays where it was in the order
        assert vars(span) == {"_name": "op", name: 3, "_late": 2} and list(vars(span)) == ["_name", name, "_late"]
    Span._otel_gil_start = property(lambda self: "class", lambda self, value: setattr(self, "_set", value))
    checks.store(second, name, 4)  # a data descriptor takes the store
    assert second._set == 4 and second._otel_gil_start == "class"
    del Span._otel_gil_start
    Span.__setattr__ = lambda self, key, value: object.__setattr__(self, key, value * 10)
    checks.store(first, name, 5)
    same(checks, first, name)
    assert first._otel_gil_start == 50

    class Guarded:  # its own __setattr__ from the start
        def __setattr__(self, key, value):
            object.__setattr__(self, key, -value)

    guarded = Guarded()
    for _ in range(2):
        checks.store(guarded, name, 6)
        same(checks, guarded, name)
        assert guarded._otel_gil_start == -6


def test_more_types_and_names_than_the_cache_holds(checks):
    types = [type(f"T{i}", (), {}) for i in range(300)]
    objs = []
    for i, t in enumerate(types):
        obj = t()
        obj.a, obj.b = i, -i
        objs.append(obj)
    for _ in range(2):
        for obj in objs:
            same(checks, obj, "a")
            same(checks, obj, "b")
            same(checks, obj, "c")


def test_an_empty_dict_filled_from_a_model_is_what_inserting_in_order_leaves(checks):
    keys = tuple(sys.intern(k) for k in ("thread.name", "thread.id", "gil.wait_ms", "gil.hold_ms", "gil.wait_ratio"))
    model = {}
    for round, values in enumerate([("a", 1, 0.5, 1.5, 0.1), ("b", 2, 0.0, 2.5, 0.0), ("c", 3, 9.0, 0.25, 0.9)]):
        target = {}
        filled = checks.fill_empty(target, model, keys, values)
        if filled == 0:  # no shortcut on this CPython: the hooks insert them
            assert sys.version_info[:2] != (3, 11) and target == {}
            continue
        assert filled == 1 and list(target.items()) == list(zip(keys, values)), round
        target["later"] = 1  # a dict of its own: the model is not touched
        assert "later" not in model
    other = tuple(reversed(keys))  # another set (order) of keys than the model's: the caller inserts
    assert checks.fill_empty({}, model, other, tuple(range(5))) == 0
