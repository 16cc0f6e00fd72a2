"""Locating take_gil without symbols, checked against the symbols where builds have them."""

import glob
import shutil
import subprocess

import pytest

from otel_gil_collector import elf, probes

PYENV_LIBS = sorted(glob.glob("/root/.pyenv/versions/3.1[0-3].*/lib/libpython3.*.so.1.0")) + sorted(
    glob.glob("/root/.pyenv/versions/3.9.*/lib/libpython3.9.so.1.0")
)


def test_the_matrix_is_here():
    assert len(PYENV_LIBS) == 5, PYENV_LIBS  # 3.9 .. 3.13: the README's table


@pytest.mark.parametrize("path", PYENV_LIBS)
def test_callers_agree_with_symbols(path):
    info = elf.load(path)
    by_symbol = next(s.address for n, s in info.functions.items() if n == "take_gil")
    assert probes.take_gil_from_callers(info, path) == by_symbol


def test_stripped_lto_debian_python_is_located():
    info = elf.load("/usr/bin/python3.11")
    assert not info.has_symtab
    offset, how = probes.locate_take_gil(info, "/usr/bin/python3.11", "/nonexistent")
    assert how == "PyEval_AcquireLock's call"
    assert offset == info.file_offset(probes.take_gil_from_callers(info, "/usr/bin/python3.11"))


def test_separate_debug_file_by_build_id(tmp_path):
    """A stripped copy whose symbols live in <root>/usr/lib/debug/.build-id/xx/yyyy.debug."""
    lib = PYENV_LIBS[0]
    stripped, debug = tmp_path / "libpython.so", tmp_path / "libpython.debug"
    shutil.copy(lib, stripped)
    subprocess.run(["objcopy", "--only-keep-debug", str(stripped), str(debug)], check=True)
    subprocess.run(["strip", "--strip-all", str(stripped)], check=True)
    info = elf.load(str(stripped))
    assert not info.has_symtab and info.build_id
    target = tmp_path / "root" / "usr/lib/debug/.build-id" / info.build_id[:2] / f"{info.build_id[2:]}.debug"
    target.parent.mkdir(parents=True)
    shutil.move(debug, target)
    offset, how = probes.locate_take_gil(info, str(stripped), str(tmp_path / "root"))
    assert how == "build-id debug file"
    assert offset == elf.load(lib).functions["take_gil"].offset


def test_symbol_variants_are_recognised():
    names = ["take_gil", "take_gil.lto_priv.0", "take_gil.constprop.0", "take_gil.isra.0"]
    assert all(probes._TAKE_GIL.match(n) for n in names)
    assert not probes._TAKE_GIL.match("take_gil.cold")
    assert not probes._TAKE_GIL.match("take_gil.part.0.cold")


def test_garbage_is_not_an_elf(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x7fELF" + b"\x02\x01" + b"\xff" * 100)
    with pytest.raises(elf.ElfLookupError):
        elf.load(str(junk))
