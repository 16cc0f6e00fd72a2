"""Function symbols of ELF files, as uprobe file offsets.

A small reader of ELF64 little-endian headers, section headers, symbol tables
and symbol versions: just what locating probes needs, fast enough to run on
every registration, and bounded because a process's files are input we do not
trust (a container image can hold anything): records must have their standard
sizes, at most ``MAX_SEGMENTS`` program headers, only the first symbol table
of each kind is read, at most
``MAX_SYMBOLS`` symbols of it, names at most ``MAX_NAME`` bytes long; so the
work is linear in the file's size whatever its headers claim. (The collector
also reads files in a worker process under a time limit: see planner.py.)
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_VERSYM = struct.Struct("<H")
_NOTE = struct.Struct("<III")
_SHT_SYMTAB, _SHT_DYNSYM, _SHT_GNU_VERSYM = 2, 11, 0x6FFFFFFF
_STT_OBJECT, _STT_FUNC, _STT_GNU_IFUNC = 1, 2, 10
_PT_LOAD, _PT_NOTE = 1, 4
_PF_X = 1
_NT_GNU_BUILD_ID = 3
_VERSYM_HIDDEN = 0x8000
MACHINES = {62: "EM_X86_64", 183: "EM_AARCH64"}
MAX_SYMBOLS = 4_000_000  # per table; libpython has ~20,000, the largest real binaries ~10^6
MAX_NAME = 4096
MAX_SEGMENTS = 256  # program headers; real files have about 15


class ElfLookupError(Exception):
    """The file is not a readable ELF64 little-endian object."""


@dataclass(frozen=True)
class Symbol:
    name: str
    address: int  # virtual address in the file (st_value)
    offset: int  # file offset: what a uprobe attaches to
    size: int


@dataclass(frozen=True)
class ElfInfo:
    machine: str
    has_symtab: bool
    functions: dict[str, Symbol]  # .symtab functions, local ones included
    dynamic: dict[str, Symbol]  # .dynsym functions, default symbol version only
    data: dict[str, Symbol]  # data objects (.dynsym, default version, then .symtab): _PyRuntime, PyDict_Type...
    build_id: str  # hex, "" if the file has none
    loads: tuple[tuple[int, int, int, bool], ...]  # PT_LOAD (vaddr, memsz, offset, executable)

    def file_offset(self, vaddr: int) -> int:
        for p_vaddr, p_memsz, p_offset, _ in self.loads:
            if p_vaddr <= vaddr < p_vaddr + p_memsz:
                return vaddr - p_vaddr + p_offset
        raise ElfLookupError(f"address {vaddr:#x} is in no loadable segment")

    def executable(self, vaddr: int) -> bool:
        return any(v <= vaddr < v + m and x for v, m, _, x in self.loads)


def _unpack(fmt: struct.Struct, data, offset: int) -> tuple:
    if offset < 0 or offset + fmt.size > len(data):
        raise ElfLookupError(f"truncated ELF (record at {offset:#x})")
    return fmt.unpack_from(data, offset)


def _cstr(data, offset: int) -> str:
    end = data.find(b"\0", offset, offset + MAX_NAME)
    if offset >= len(data) or end < 0:
        raise ElfLookupError("symbol name out of bounds")
    return data[offset:end].decode("utf-8", "replace")


def _parse(data) -> ElfInfo:
    ident, _, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _ = _unpack(_EHDR, data, 0)
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
        raise ElfLookupError("not an ELF64 little-endian file")
    if phnum and phentsize != _PHDR.size or shnum and shentsize != _SHDR.size:
        raise ElfLookupError(f"non-standard header sizes (program {phentsize} B, section {shentsize} B)")
    if phnum > MAX_SEGMENTS:
        raise ElfLookupError(f"{phnum} program headers (at most {MAX_SEGMENTS} are read)")
    loads, build_id = [], ""
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = _unpack(_PHDR, data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_memsz, p_offset, bool(p_flags & _PF_X)))
        elif p_type == _PT_NOTE and not build_id:
            build_id = _build_id(data, p_offset, p_filesz)
    sections = [_unpack(_SHDR, data, shoff + i * shentsize) for i in range(shnum)]
    versym = next((s for s in sections if s[1] == _SHT_GNU_VERSYM), None)

    def table(kind: int) -> tuple[dict[str, Symbol], dict[str, Symbol]]:
        """(functions, data objects) of the first section of ``kind`` (real files have one):
        never table x tables."""
        out: dict[str, Symbol] = {}
        objects: dict[str, Symbol] = {}
        sec = next((s for s in sections if s[1] == kind), None)
        if sec is not None and sec[6] < len(sections):
            strtab = sections[sec[6]]
            names = data[strtab[4] : strtab[4] + strtab[5]]
            count = sec[5] // _SYM.size
            if count > MAX_SYMBOLS:
                raise ElfLookupError(f"{count} symbols in one table (at most {MAX_SYMBOLS} are read)")
            for i in range(count):
                st_name, st_info, _, st_shndx, st_value, st_size = _unpack(_SYM, data, sec[4] + i * _SYM.size)
                if st_info & 0xF not in (_STT_OBJECT, _STT_FUNC, _STT_GNU_IFUNC) or not st_value or not st_shndx:
                    continue
                if kind == _SHT_DYNSYM and versym is not None:
                    (ver,) = _unpack(_VERSYM, data, versym[4] + 2 * i)
                    if ver & _VERSYM_HIDDEN:
                        continue  # a compat version (name@VER), not the one programs link to
                name = _cstr(names, st_name)
                for vaddr, memsz, off, _ in loads:
                    if vaddr <= st_value < vaddr + memsz:
                        into = objects if st_info & 0xF == _STT_OBJECT else out
                        into.setdefault(name, Symbol(name, st_value, st_value - vaddr + off, st_size))
                        break
        return out, objects

    functions, local_data = table(_SHT_SYMTAB)
    dynamic, data = table(_SHT_DYNSYM)
    return ElfInfo(
        MACHINES.get(machine, f"EM_{machine}"), bool(functions), functions, dynamic, {**local_data, **data},
        build_id, tuple(loads),
    )


def _build_id(data, offset: int, size: int) -> str:
    """The GNU build-id in a PT_NOTE segment, as hex."""
    end = offset + size
    while offset + 12 <= end:
        namesz, descsz, kind = _unpack(_NOTE, data, offset)
        name_at = offset + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if kind == _NT_GNU_BUILD_ID and data[name_at : name_at + namesz] == b"GNU\0":
            return bytes(data[desc_at : desc_at + descsz]).hex()
        offset = desc_at + (descsz + 3) // 4 * 4
    return ""


def read(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes of the file at ``offset`` (code to inspect when symbols are missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)
    except OSError as exc:
        raise ElfLookupError(f"cannot read {path}: {exc}") from None


_cache: OrderedDict[tuple[int, int, int, int], ElfInfo] = OrderedDict()
_CACHE_SIZE = 32


def load(path: str) -> ElfInfo:
    """Symbols of the ELF file at ``path``, cached by file identity while it is unchanged."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            info = _cache.get(key)
            if info is None:
                with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as data:
                    info = _parse(data)
                _cache[key] = info
                if len(_cache) > _CACHE_SIZE:
                    _cache.popitem(last=False)
            return info
    except (OSError, ValueError) as exc:
        raise ElfLookupError(f"cannot read {path}: {exc}") from None
    except ElfLookupError as exc:
        raise ElfLookupError(f"{path}: {exc}") from None
