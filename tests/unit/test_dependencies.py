"""One direction of dependencies: the root side (otel_gil_collector, the otel-gil-collector
distribution in collector/) uses otel_gil's protocol, ring and layout; otel_gil, installed
into every app, never imports it, and its distribution carries no root tool."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOT_SIDE = ROOT / "collector" / "otel_gil_collector"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_otel_gil_never_imports_the_root_side():
    for path in sorted((ROOT / "otel_gil").glob("*.py")):
        assert not _imports(path) & {"otel_gil_collector", "collector", "bcc"}, path


def test_every_root_tool_is_on_the_root_side():
    root_side = {p.stem for p in ROOT_SIDE.glob("*.py")}
    assert {"attach", "report", "top", "timeline", "server", "tracer", "probes"} <= root_side
    assert not {p.stem for p in (ROOT / "otel_gil").glob("*.py")} & {"attach", "report", "top", "timeline", "server"}


def test_the_collector_pins_the_app_side_of_its_own_version():
    """One ring layout: otel-gil-collector requires exactly the otel-gil it was released with."""
    app = re.search(r'__version__ = "(.+)"', (ROOT / "otel_gil" / "version.py").read_text()).group(1)
    collector = (ROOT / "collector" / "pyproject.toml").read_text()
    assert f'version = "{app}"' in collector and f'"otel-gil=={app}"' in collector
