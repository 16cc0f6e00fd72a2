"""The contract between otel_gil's C parts and its Python: every field of ``Start.own`` has
spans.Own's name at spans.Own's place, and each native module's stub (``.pyi``, shipped as
package data) names exactly what the module has, each function, method and class with the
parameters its C code parses (read from the C sources: calling convention, kwlist, format)."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import importlib
import subprocess
import sys
import sysconfig
import typing
from pathlib import Path

import pytest

from helpers import free_threaded_interpreters
from otel_gil import spans

ROOT = Path(__file__).resolve().parents[2]
STUB_ONLY = {"Counters", "GotEntry", "Figures"}  # names the stubs give types the modules have no object for
MODULES = ["_fastspan", "_inprocess", "_parkcontexts"]
FREE_THREADED_MODULES = {"_parkcontexts"}  # built on free-threaded builds only (setup.py)


def native(name: str):
    try:
        return importlib.import_module(f"otel_gil.{name}")
    except ImportError as exc:
        pytest.fail(f"otel_gil.{name} is not built ({exc}): pip install -e . (needs a C compiler and Python.h)")


def public(name: str) -> dict[str, str]:
    """The public names of ``otel_gil.<name>`` and their objects' type names: imported here, or, for
    a module of free-threaded builds only, by the matrix's free-threaded interpreter."""
    if name not in FREE_THREADED_MODULES:
        module = native(name)
        return {n: type(getattr(module, n)).__name__ for n in dir(module) if not n.startswith("_")}
    (runner,) = free_threaded_interpreters().values()
    done = subprocess.run([runner.python, "-W", "error::RuntimeWarning", "-c", f"""import json, otel_gil.{name} as m
print(json.dumps({{n: type(getattr(m, n)).__name__ for n in dir(m) if not n.startswith('_')}}))"""],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, f"otel_gil.{name} not built for {runner.python} (matrix-venvs.sh): {done.stderr}"
    return json.loads(done.stdout)


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


# The park hooks: built on free-threaded builds only (their C code is under Py_GIL_DISABLED).
FREE_THREADED_ONLY = {"install_parks", "uninstall_parks"}


@pytest.mark.parametrize("name", MODULES)
def test_each_native_module_has_a_stub_naming_what_it_has(name):
    tree = stub(name)
    stubbed = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    stubbed |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    stubbed |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
    names = set(public(name))
    assert stubbed - STUB_ONLY - FREE_THREADED_ONLY == names - FREE_THREADED_ONLY
    free_threaded = name in FREE_THREADED_MODULES or bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    assert names & FREE_THREADED_ONLY == (FREE_THREADED_ONLY & stubbed if free_threaded else set())


def test_the_stubs_are_package_data():
    import tomllib  # the test venv's Python is 3.11+

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["otel_gil"]
    stubs = sorted(p.name for p in (ROOT / "otel_gil").glob("*.pyi"))
    assert stubs == [f"{m}.pyi" for m in MODULES]
    assert all(any(fnmatch.fnmatch(s, p) for p in patterns) for s in stubs), (stubs, patterns)


# Functions of the shipped modules that only tests call: read-only views of the module's own
# state, which no harness outside it can see (they take no argument).
DIAGNOSTICS = {"got_entries", "forks"}


@pytest.mark.parametrize("name", MODULES)
def test_no_test_only_function_ships(name):
    """Each function of a shipped module is called by otel_gil's or the collector's code, or
    named in the README (a diagnostic for users); test-only code compiles in the tests."""
    sources = "".join(p.read_text() for d in ("otel_gil", "collector") for p in (ROOT / d).rglob("*.py"))
    sources += (ROOT / "README.md").read_text()
    functions = {n for n, kind in public(name).items() if kind == "builtin_function_or_method"}
    assert {n for n in functions - DIAGNOSTICS if f"{n}(" not in sources} == set()


# -- signatures: each stub's parameters against the C parts' own argument parsing, read from
# the sources setup.py builds each module from. A parameter is (kind, name, has a default):
# "positional" (positional-only: no name), "either" (positional or keyword), "keyword" (only).
Param = typing.Tuple[str, typing.Optional[str], bool]
POSITIONAL: Param = ("positional", None, False)


def c_source(name: str) -> str:
    """The C sources setup.py builds ``otel_gil.<name>`` from, as one text."""
    lists = dict(re.findall(r'\("(_\w+)", \[([^\]]*)\]\)', (ROOT / "setup.py").read_text()))
    return "\n".join((ROOT / "otel_gil" / f"{s}.c").read_text() for s in re.findall(r'"(\w+)"', lists[name]))


def c_body(src: str, func: str) -> str:
    """The body of the C function ``func`` (its definition, not a call or a prototype)."""
    start = re.search(rf"^\w[^;\n]*\b{func}\([^;{{]*\{{", src, re.M)
    assert start, f"{func}: no definition in the C sources"
    depth, end = 1, start.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(src[end], 0)
        end += 1
    return src[start.end():end]


def c_table(src: str, kind: str, name: str) -> dict[str, tuple[str, str]]:
    """name -> (C function, flags) of a PyMethodDef table; name -> (member type, '') of the others."""
    (table,) = re.findall(rf"{kind} {name}\[\] = \{{(.*?)\n\}};", src, re.S)
    entry = r'\{"(\w+)",\s*(?:\(\w+\))?(?:\(void \(\*\)\(void\)\))?(\w+),\s*([A-Z_| ]+?),'
    if kind != "PyMethodDef":
        entry = r'\{"(\w+)",\s*\(?(\w+)()'
    return {n: (f, flags) for n, f, flags in re.findall(entry, table)}


def format_params(fmt: str, names: "list[str] | None") -> list[Param]:
    """The parameters a PyArg_ParseTuple(AndKeywords) format string takes (names: its kwlist)."""
    fmt = re.split("[:;]", fmt)[0]
    units = re.findall(r"[|$]|\([^)]*\)|[A-Za-z][!&#*]?", fmt)  # (...): one tuple parameter
    assert "".join(units) == fmt, f"format {fmt!r}: units this test does not know"
    params, optional, keyword_only = [], False, False
    for unit in units:
        optional, keyword_only = optional or unit == "|", keyword_only or unit == "$"
        if unit not in "|$":
            kind = "keyword" if keyword_only else "either" if names is not None else "positional"
            params.append((kind, names[len(params)] if names is not None else None, optional))
    assert names is None or len(names) == len(params), (fmt, names)
    return params


def c_params(src: str, func: str, flags: str) -> list[Param]:
    """The parameters ``func`` takes, by its calling convention and its own argument checks."""
    if flags == "METH_NOARGS":
        return []
    if flags == "METH_O":
        return [POSITIONAL]
    body = c_body(src, func)
    while "PyArg_Parse" not in body and (wrapped := re.search(r"(?:locked_kw\()?(\w+)\(?(?:, )?\w+, args, kwds\)", body)):
        body = c_body(src, wrapped[1])  # a wrapper taking a lock, say
    if flags in ("METH_VARARGS | METH_KEYWORDS", "tp_init"):
        (names,) = re.findall(r"kwlist\[\] = \{(.*?),\s*NULL\}", body, re.S)
        (fmt,) = re.findall(r'PyArg_ParseTupleAndKeywords\(args, kwds, "([^"]*)"', body)
        return format_params(fmt, re.findall(r'"(\w+)"', names))
    if flags == "METH_VARARGS":
        (fmt,) = re.findall(r'PyArg_ParseTuple\(args, "([^"]*)"', body)
        return format_params(fmt, None)
    assert flags == "METH_FASTCALL" or "kwnames != NULL" in body, f"{func}: keywords taken and ignored"
    (count,) = re.findall(r"\bnargsf?\)? != (\d+)", body)
    return [POSITIONAL] * int(count)


def stub_params(node: ast.FunctionDef, method: bool) -> list[Param]:
    args = node.args
    assert not args.vararg and not args.kwarg, ast.unparse(node)
    both = args.posonlyargs + args.args
    first_default = len(both) - len(args.defaults)
    params = [("positional", None, i >= first_default) if i < len(args.posonlyargs) else
              ("either", a.arg, i >= first_default) for i, a in enumerate(both)]
    params += [("keyword", a.arg, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    return params[1:] if method else params


def stub_defs(body: list) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in body if isinstance(n, ast.FunctionDef)}


def is_property(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


@pytest.mark.parametrize("name", MODULES)
def test_each_stubbed_function_takes_what_its_c_function_parses(name):
    """Positional-only where C takes positions only (METH_O, METH_VARARGS, METH_FASTCALL: the
    stub says so with ``/``), keyword names in kwlist's order, as many as the format parses."""
    src = c_source(name)
    (methods,) = re.findall(r"\.m_methods = (\w+)", src)
    table = c_table(src, "PyMethodDef", methods)
    stubbed = stub_defs(stub(name).body)
    assert set(stubbed) == set(table)
    for function, (func, flags) in table.items():
        assert stub_params(stubbed[function], False) == c_params(src, func, flags), function


@pytest.mark.parametrize("name", MODULES)
def test_each_stubbed_class_has_its_c_types_methods_attributes_and_calls(name):
    """Methods (tp_methods) with their parameters, attributes (tp_members, tp_getset), and
    ``__init__``/``__call__`` exactly where the type has tp_init/a vectorcall."""
    src = c_source(name)
    types = dict(re.findall(r'PyModule_AddObject(?:Ref)?\(m, "(\w+)", \(PyObject \*\)&(\w+)\)', src))
    defined = dict(re.findall(r"\n(?:static )?PyTypeObject (\w+) = \{(.*?)\n\};", src, re.S))
    classes = {n.name: n for n in stub(name).body if isinstance(n, ast.ClassDef)}
    checked = {c for c in classes if types.get(c) in defined}
    assert set(classes) - checked <= STUB_ONLY | {"Own", "Unsupported"}  # a struct sequence, an exception
    for cls in checked:
        slots = dict(re.findall(r"\.(tp_\w+) = (?:\(\w+\))?(\w+)", defined[types[cls]]))
        defs = stub_defs(classes[cls].body)
        attrs = {n.target.id for n in classes[cls].body if isinstance(n, ast.AnnAssign)}
        attrs |= {n for n, d in defs.items() if is_property(d)}
        c_attrs = set()
        for kind, slot in (("PyMemberDef", "tp_members"), ("PyGetSetDef", "tp_getset")):
            c_attrs |= set(c_table(src, kind, slots[slot])) if slot in slots else set()
        assert attrs == c_attrs, cls
        table = c_table(src, "PyMethodDef", slots["tp_methods"]) if "tp_methods" in slots else {}
        plain = {n: d for n, d in defs.items() if not n.startswith("__") and not is_property(d)}
        assert set(plain) == set(table), cls
        for method, (func, flags) in table.items():
            assert stub_params(plain[method], True) == c_params(src, func, flags), f"{cls}.{method}"
        calls = {}
        if "tp_init" in slots:
            calls["__init__"] = c_params(src, slots["tp_init"], "tp_init")
        if "tp_vectorcall_offset" in slots:
            (vectorcall,) = re.findall(r"->vectorcall = \(vectorcallfunc\)(\w+)", c_body(src, slots["tp_init"]))
            calls["__call__"] = c_params(src, vectorcall, "vectorcall")
        assert {n: stub_params(d, True) for n, d in defs.items() if n.startswith("__")} == calls, cls
