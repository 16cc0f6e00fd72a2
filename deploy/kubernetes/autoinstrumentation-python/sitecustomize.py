"""The tree's sitecustomize (build-tree.sh puts it in place of opentelemetry-instrumentation's,
which the Operator's PYTHONPATH names first), for CPythons the tree was not built for:

- older than its SDK requires (its ``Requires-Python``): the tree leaves ``sys.path``, as its
  packages (3.10 syntax) would shadow the app's own and crash it; the app runs uninstrumented;
- free-threaded: the tree's stable-ABI extensions (``.abi3.so``: psutil's, protobuf's) are not
  loaded, as they are built for the GIL's object layout and crash it (CPython 3.13t still lists
  ``.abi3.so``): their packages' pure-Python fallbacks, or an ImportError, instead.

Then OpenTelemetry's auto-instrumentation, as the original. Python 3.6 syntax: any CPython reads it.
"""

import glob
import importlib.machinery
import os
import sys
import sysconfig

_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _requires_python():
    """The (major, minor) the tree's OpenTelemetry API requires (``>=3.X``), or None."""
    for metadata in glob.glob(os.path.join(_TREE, "opentelemetry_api-*.dist-info", "METADATA")):
        with open(metadata, encoding="utf-8") as lines:
            for line in lines:
                if line.startswith("Requires-Python: >="):
                    return tuple(int(p) for p in line.split(">=")[1].strip().split(".")[:2])
    return None


def _inside(path):
    return (os.path.abspath(path or os.getcwd()) + os.sep).startswith(_TREE + os.sep)


def _leave_path(oldest):
    sys.path[:] = [p for p in sys.path if not _inside(p)]
    sys.stderr.write("otel-gil: CPython %d.%d is older than the instrumentation tree's %d.%d: not instrumented\n"
                     % (sys.version_info[:2] + oldest))


def _no_abi3_from_tree():
    machinery = importlib.machinery
    suffixes = [s for s in machinery.EXTENSION_SUFFIXES if s != ".abi3.so"]
    in_tree = machinery.FileFinder.path_hook((machinery.ExtensionFileLoader, suffixes),
                                             (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
                                             (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES))
    for i, hook in enumerate(sys.path_hooks):
        if getattr(hook, "__name__", "") == "path_hook_for_FileFinder":
            sys.path_hooks[i] = lambda path, default=hook: (in_tree if _inside(path) else default)(path)
            sys.path_importer_cache.clear()
            return


_OLDEST = _requires_python()
if _OLDEST and sys.version_info[:2] < _OLDEST:
    _leave_path(_OLDEST)
else:
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        _no_abi3_from_tree()
    from opentelemetry.instrumentation.auto_instrumentation import initialize

    initialize()
