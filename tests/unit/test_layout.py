"""The slot layout is defined twice, in C (otel_gil/gil_layout.h) and in Python
(otel_gil/ring.py): compile the C half and check both agree, field by field."""

import ctypes
import subprocess
from pathlib import Path

import pytest

from otel_gil import ring

HEADER = Path(__file__).resolve().parents[2] / "otel_gil" / "gil_layout.h"
STRUCTS = {"gil_header": ring.Header, "gil_slot": ring.Slot, "gil_long_wait": ring.LongWait,
           "gil_long_hold": ring.LongHold, "gil_hold": ring.HoldRecord, "gil_hold_page": ring.HoldPage,
           "gil_frame": ring.FrameRecord, "gil_location": ring.LocationRecord, "gil_py_layout": ring.PyLayout, "gil_long_park": ring.LongPark}
CONSTANTS = {
    "GIL_MAGIC": ring.MAGIC,
    "GIL_LAYOUT_VERSION": ring.LAYOUT_VERSION,
    "GIL_HIST_BUCKETS": ring.HIST_BUCKETS,
    "GIL_RING_LEN": ring.RING_LEN,
    "GIL_PROBE_LEN": ring.PROBE_LEN,
    "GIL_SLOT_IN_TAKE_GIL": ring.SLOT_IN_TAKE_GIL,
    "GIL_SLOT_FORCED": ring.SLOT_FORCED,
    "GIL_SLOT_UNCHECKED": ring.SLOT_UNCHECKED,
    "GIL_WAIT_FORCED": ring.WAIT_FORCED,
    "GIL_HOLD_LOG_LEN": ring.HOLD_LOG_LEN,
    "GIL_HOLDS_PER_PAGE": ring.HOLDS_PER_PAGE,
    "GIL_HOLD_PAGES": ring.HOLD_PAGES,
    "GIL_HOLD_RECORD_NS": ring.HOLD_RECORD_NS,
    "GIL_LOC_LEN": ring.LOC_LEN,
    "GIL_LOC_FRAMES": ring.LOC_FRAMES,
    "GIL_LOC_NAME": ring.LOC_NAME,
    "GIL_LOC_FILE": ring.LOC_FILE,
    "GIL_LOC_WHYS": ring.LOC_WHYS,
    "GIL_LOC_NO_LAYOUT": ring.LOC_NO_LAYOUT,
    "GIL_LOC_HOLDER": ring.LOC_HOLDER,
    "GIL_LOC_NO_FRAME": ring.LOC_NO_FRAME,
    "GIL_LOC_UNREADABLE": ring.LOC_UNREADABLE,
    "GIL_LOC_NOT_CODE": ring.LOC_NOT_CODE,
    "GIL_LOC_NOT_STR": ring.LOC_NOT_STR,
    "GIL_LOC_NO_LINE": ring.LOC_NO_LINE,
    "GIL_FRAME_OBJECT": ring.FRAME_OBJECT,
    "GIL_FRAME_INTERP": ring.FRAME_INTERP,
    "GIL_LINES_LNOTAB": ring.LINES_LNOTAB,
    "GIL_LINES_PAIRS": ring.LINES_PAIRS,
    "GIL_LINES_LOCATIONS": ring.LINES_LOCATIONS,
    "GIL_PARK_STW": ring.PARK_STW,
    "GIL_PARK_OBJECT": ring.PARK_OBJECT,
    "GIL_PARK_APP_LOCK": ring.PARK_APP_LOCK,
    "GIL_PARK_INTERNAL": ring.PARK_INTERNAL,
    "GIL_PARK_OTHER": ring.PARK_OTHER,
    "GIL_PARK_KINDS": ring.PARK_KINDS,
    "GIL_PARK_RING_LEN": ring.PARK_RING_LEN,
    "GIL_PARK_TYPE": ring.PARK_TYPE,
}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory) -> dict[str, int]:
    lines = []
    for cname, pystruct in STRUCTS.items():
        lines.append(f'printf("sizeof:{cname} %zu\\n", sizeof(struct {cname}));')
        for field, _ in pystruct._fields_:
            lines.append(
                f'printf("{cname}.{field} %zu %zu\\n", offsetof(struct {cname}, {field}), '
                f"sizeof(((struct {cname} *)0)->{field}));"
            )
    for name in CONSTANTS:
        lines.append(f'printf("{name} %llu\\n", (unsigned long long)({name}));')
    src = "\n".join(
        ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>", f'#include "{HEADER}"',
         "int main(void) {", *lines, "return 0; }"]
    )
    work = tmp_path_factory.mktemp("layout")
    (work / "layout.c").write_text(src)
    subprocess.run(["cc", "-Wall", "-Werror", "-o", str(work / "layout"), str(work / "layout.c")], check=True)
    out = subprocess.run([str(work / "layout")], check=True, capture_output=True, text=True).stdout
    facts = {}
    for line in out.splitlines():
        key, *values = line.split()
        facts[key] = tuple(int(v) for v in values) if len(values) > 1 else int(values[0])
    return facts


@pytest.mark.parametrize("cname", STRUCTS)
def test_struct_sizes_agree(c_layout, cname):
    assert c_layout[f"sizeof:{cname}"] == ctypes.sizeof(STRUCTS[cname])


@pytest.mark.parametrize("cname", STRUCTS)
def test_field_offsets_and_sizes_agree(c_layout, cname):
    pystruct = STRUCTS[cname]
    for field, _ in pystruct._fields_:
        descriptor = getattr(pystruct, field)
        assert c_layout[f"{cname}.{field}"] == (descriptor.offset, descriptor.size), field


@pytest.mark.parametrize("name", CONSTANTS)
def test_constants_agree(c_layout, name):
    assert c_layout[name] == CONSTANTS[name]


def test_header_and_hold_pages_fit_in_a_slot_sized_entry():
    assert ctypes.sizeof(ring.Header) <= ring.SLOT_SIZE
    assert ring.SLOT_SIZE % 8 == 0  # BPF array entries are 8-byte aligned
    assert ring.RING_LEN & (ring.RING_LEN - 1) == 0  # the BPF side masks the ring index
    assert ring.HIST_BUCKETS & (ring.HIST_BUCKETS - 1) == 0
    assert ctypes.sizeof(ring.HoldPage) <= ring.SLOT_SIZE  # a page of the hold log is one array entry
    assert ctypes.sizeof(ring.LocationRecord) <= ring.SLOT_SIZE  # a location is one array entry
    assert ring.LOC_LEN & (ring.LOC_LEN - 1) == 0 and ring.LOC_NAME % 4 == 0 and ring.LOC_FILE % 4 == 0
    assert len(ring.LOC_WHY_NAMES) <= ring.LOC_WHYS
    for n in (ring.HOLD_LOG_LEN, ring.HOLDS_PER_PAGE):  # the BPF side masks hold indices
        assert n & (n - 1) == 0


def test_the_c_span_hooks_were_built_from_this_layout():
    """otel_gil._fastspan includes gil_layout.h too: a stale build must not read the ring."""
    from otel_gil import _fastspan

    assert (_fastspan.LAYOUT_VERSION, _fastspan.SLOT_SIZE) == (ring.LAYOUT_VERSION, ring.SLOT_SIZE)
