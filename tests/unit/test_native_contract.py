"""The contract between otel_gil's C parts and its Python: every field of ``Start.own`` has
spans.Own's name at spans.Own's place, and each native module's stub (``.pyi``, shipped as
package data) names exactly what the module has."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import sys
import typing
from pathlib import Path

import pytest

from otel_gil import spans

ROOT = Path(__file__).resolve().parents[2]
STUB_ONLY = {"Counters", "GotEntry"}  # names the stubs give types the modules have no object for


def native(name: str):
    try:
        return importlib.import_module(f"otel_gil.{name}")
    except ImportError as exc:
        pytest.fail(f"otel_gil.{name} is not built ({exc}): pip install -e . (needs a C compiler and Python.h)")


def stub(name: str) -> ast.Module:
    return ast.parse((ROOT / "otel_gil" / f"{name}.pyi").read_text())


def stub_fields(tree: ast.Module, cls: str) -> list[tuple[str, str]]:
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    return [(n.target.id, ast.unparse(n.annotation)) for n in node.body if isinstance(n, ast.AnnAssign)]


def test_start_own_has_spans_owns_fields_in_order():
    own = native("_fastspan").Own
    assert own.n_fields == own.n_sequence_fields == len(spans.Own._fields) == 11
    if sys.version_info >= (3, 10):  # struct sequences name their fields in __match_args__ from 3.10
        assert own.__match_args__ == spans.Own._fields
    values = own(tuple(range(11)))
    assert spans.Own(*values) == values  # how spans.py reads it
    assert all(getattr(values, name) == getattr(spans.Own(*values), name) for name in spans.Own._fields)


def test_the_stub_of_own_is_spans_own():
    annotations = [(name, kind.__name__) for name, kind in typing.get_type_hints(spans.Own).items()]
    assert stub_fields(stub("_fastspan"), "Own") == annotations


@pytest.mark.parametrize("name", ["_fastspan", "_inprocess"])
def test_each_native_module_has_a_stub_naming_what_it_has(name):
    module = native(name)
    tree = stub(name)
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    stubbed |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    stubbed |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
    public = {n for n in dir(module) if not n.startswith("_")}
    assert stubbed - STUB_ONLY == public


def test_the_stubs_are_package_data():
    import tomllib  # the test venv's Python is 3.11+

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["otel_gil"]
    stubs = sorted(p.name for p in (ROOT / "otel_gil").glob("*.pyi"))
    assert stubs == ["_fastspan.pyi", "_inprocess.pyi"]
    assert all(any(fnmatch.fnmatch(s, p) for p in patterns) for s in stubs), (stubs, patterns)


# Functions of the shipped modules that only tests call: read-only views of the module's own
# state, which no harness outside it can see (they take no argument).
DIAGNOSTICS = {"got_entries", "forks"}


@pytest.mark.parametrize("name", ["_fastspan", "_inprocess"])
def test_no_test_only_function_ships(name):
    """Each function of a shipped module is called by otel_gil's or the collector's code, or
    named in the README (a diagnostic for users); test-only code compiles in the tests."""
    sources = "".join(p.read_text() for d in ("otel_gil", "collector") for p in (ROOT / d).rglob("*.py"))
    sources += (ROOT / "README.md").read_text()
    module = native(name)
    functions = {n for n in dir(module) if not n.startswith("_") and type(getattr(module, n)).__name__ ==
                 "builtin_function_or_method"}
    assert {n for n in functions - DIAGNOSTICS if f"{n}(" not in sources} == set()
