"""What a park on each of a set of this process's addresses is counted as, by the in-process
writer's ``park_kind()`` (otel_gil/park_kind.h, through tests/unit/park_kind_checks.c compiled
here for this interpreter in DIR) and by the collector's twin (otel_gil_collector/parkkinds.py,
reading this process's memory as it reads a target's), both told where to look by the same
facts (``parks.where()``, what ``install_parks`` is given). A free-threaded build running without
its GIL (3.13t, PYTHON_GIL=0). Usage: python park_kinds.py DIR. Prints
``{label: [[C's kind, type name], [the collector's kind, type name]]}`` as JSON.

Only the calling thread's own state is asked: ``park_kind()`` knows no other thread's (a thread
parks on no other's), the collector knows every thread's (it cannot tell which thread asks).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

from otel_gil import parks, pystructs
from otel_gil_collector import parkkinds, probes

ROOT = Path(__file__).resolve().parents[2]


def checks(work: Path):
    """park_kind_checks.c built for this interpreter, imported."""
    built = work / f"park_kind_checks{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{sysconfig.get_paths()['include']}",
                    f"-I{ROOT / 'otel_gil'}", "-o", str(built), str(ROOT / "tests" / "unit" / "park_kind_checks.c")],
                   check=True)
    spec = importlib.util.spec_from_file_location("park_kind_checks", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Meta(type):
    pass


class WithMeta(metaclass=Meta):
    pass


LongName = type("L" * 100, (), {})  # a type name longer than a park's type field

c = checks(Path(sys.argv[1]))
assert not sys._is_gil_enabled(), "the GIL is on (PYTHON_GIL=0?)"
c.set_where(*parks.where())
found = probes.interpreter(os.getpid())
kinds = parkkinds.Classifier(os.getpid(), found.maps, found.mapping.path, found.info)
row = pystructs.PARKING[sys.version_info[:2]]
ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
objects = {"list": [], "dict": {}, "set": set(), "Lock": threading.Lock(), "RLock": threading.RLock(),
           "metaclass instance": WithMeta(), "long-named instance": LongName()}
buffer = ctypes.create_string_buffer(256)
addresses = {
    "own thread state": ctypes.pythonapi.PyThreadState_Get() + row.tstate_state,
    "stop-the-world (runtime)": kinds.runtime + row.stw_runtime,
    "stop-the-world (interpreter)": kinds.interp + row.stw_interp,
    "runtime field": kinds.runtime + 64,
    "interpreter field": kinds.interp + 64,
    "zeroed buffer": ctypes.addressof(buffer) + 64,
    "unmapped": 4096,
    "misaligned list mutex": id(objects["list"]) + row.ob_mutex + 1,
    **{f"{name}'s lock mutex": id(obj) + row.lock_mutex for name, obj in objects.items()},
    **{f"{name}'s ob_mutex": id(obj) + row.ob_mutex for name, obj in objects.items()},
}
theirs = kinds.kinds_of(set(addresses.values()))
both = {}
for label, address in addresses.items():
    kind, name = c.park_kind_of(address)
    both[label] = [[kind, name.decode("utf-8", "replace")], list(theirs[address])]
print(json.dumps(both))
