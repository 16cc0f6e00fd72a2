"""Every function's code object in this interpreter's standard library (or a sample), with the
line CPython gives each instruction: JSON lines of
{"format", "first_line", "table" (hex), "lines": [[byte offset, line or 0], ...]} on stdout.

Run by tests/unit/test_line_tables.py under each interpreter of the matrix (each has its
own line-table format)."""

from __future__ import annotations

import dis
import json
import os
import sys
import types

FORMAT = 1 if sys.version_info < (3, 10) else 2 if sys.version_info < (3, 11) else 3  # ring.LINES_*


def code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_objects(const)


def lines(code: types.CodeType) -> list[list[int]]:
    """[byte offset, line (0: none)] of every instruction, as PyCode_Addr2Line gives it."""
    if FORMAT == 1:  # 3.9: an instruction's line is that of the last line start at or before it
        starts = list(dis.findlinestarts(code))
        out, line = [], code.co_firstlineno
        for offset in range(0, len(code.co_code), 2):
            line = next((ln for start, ln in reversed(starts) if start <= offset), code.co_firstlineno)
            out.append([offset, line])
        return out
    return [[offset, line or 0] for start, end, line in code.co_lines() for offset in range(start, end, 2)]


def main() -> None:
    every = int(sys.argv[1]) if len(sys.argv) > 1 else 1  # one module in `every`
    root = os.path.dirname(os.__file__)
    paths = sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".py"))
    for path in paths[::every]:
        try:
            module = compile(open(path, "rb").read(), path, "exec")
        except (SyntaxError, ValueError, UnicodeDecodeError):
            continue
        for code in code_objects(module):
            if code.co_name == "<module>":  # module bodies run once, at import
                continue
            table = code.co_lnotab if FORMAT == 1 else code.co_linetable
            print(json.dumps({"format": FORMAT, "first_line": code.co_firstlineno, "table": table.hex(),
                              "lines": lines(code)}))


if __name__ == "__main__":
    main()
