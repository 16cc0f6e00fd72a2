"""The collector's line-table decoder (collector/otel_gil_collector/gil_lines.h, which runs in
BPF; the in-process writer calls PyCode_Addr2Line) against the lines CPython itself gives
every instruction of its standard library's code objects, in each format: 3.9's lnotab,
3.10's pairs, 3.11+'s location table. A line past the part of a table the decoder reads
is unknown (-1), never another line; that is 5 % of 3.11's instructions (weighted by code unit)
and under 1 % of 3.13's for the innermost frame (2,048 bytes read)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINES_H = ROOT / "collector" / "otel_gil_collector" / "gil_lines.h"
LINES_MAX = int(re.search(r"#define GIL_LINES_MAX (\d+)", (ROOT / "collector" / "otel_gil_collector" / "gil.bpf.c")
                          .read_text()).group(1))  # what the BPF program decodes of the innermost frame's table
# Feeds gil_decode_line from stdin: "format first_line size hex-table n addr..." a line; prints the lines.
HARNESS = r"""
#include <linux/types.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define GIL_READ(dst, n, src) (memcpy((dst), (const void *)(src), (n)), 0)
#include "gil_lines.h"
static struct gil_lines_scratch scratch;
int main(void) {
    int format, first_line, count;
    unsigned size;
    static char hex[1 << 20];
    while (scanf("%d %d %u %s %d", &format, &first_line, &size, hex, &count) == 5) {
        unsigned n = size < GIL_LINES_MAX ? size : GIL_LINES_MAX;
        for (unsigned i = 0; i < n; i++)
            sscanf(hex + 2 * i, "%2hhx", &scratch.bytes[i]);
        for (int i = 0; i < count; i++) {
            long addr;
            if (scanf("%ld", &addr) != 1)
                return 1;
            printf("%d ", gil_decode_line(&scratch.t, scratch.bytes, n, size, format, first_line, addr, GIL_LINES_MAX));
        }
        printf("\n");
    }
    return 0;
}
"""
PYTHONS = {"3.9": ROOT / ".venv-matrix" / "3.9" / "bin" / "python",
           "3.10": ROOT / ".venv-matrix" / "3.10" / "bin" / "python",
           "3.11": Path(sys.executable), "3.13": ROOT / ".venv-matrix" / "3.13" / "bin" / "python"}


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("lines")
    (work / "harness.c").write_text(HARNESS)
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-DGIL_LINES_MAX={LINES_MAX}", f"-I{LINES_H.parent}",
                    f"-I{ROOT / 'otel_gil'}", "-o", str(work / "harness"), str(work / "harness.c")], check=True)
    return work / "harness"


@pytest.mark.parametrize("version", PYTHONS)
def test_the_decoder_gives_cpythons_lines(decoder, version):
    python = PYTHONS[version]
    if not python.exists():
        pytest.fail(f"{python} is missing: run 'make matrix' (or 'make test') first")
    dumped = subprocess.run([str(python), str(ROOT / "tests" / "workloads" / "line_tables.py"), "10"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    codes = [json.loads(line) for line in dumped]
    request = "".join(f"{c['format']} {c['first_line']} {len(c['table']) // 2} {c['table'] or '-'} {len(c['lines'])} "
                      + " ".join(str(offset) for offset, _ in c["lines"]) + "\n" for c in codes)
    decoded = subprocess.run([str(decoder)], input=request, capture_output=True, text=True, check=True).stdout
    known = unknown = 0
    for code, got in zip(codes, decoded.splitlines()):
        for (offset, line), value in zip(code["lines"], map(int, got.split())):
            if value == -1:  # past the bytes the decoder reads: unknown, never another line
                assert len(code["table"]) // 2 > LINES_MAX, (code["table"], offset)
                unknown += 1
            else:
                assert value == line, (version, code["first_line"], offset, line, value)
                known += 1
    assert len(decoded.splitlines()) == len(codes) > 1000
    assert known > 0.9 * (known + unknown), (known, unknown)  # 3.11's tables are the longest: 95 %
