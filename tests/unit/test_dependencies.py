"""One direction of dependencies: the root side (otel_gil_collector, sources in collector/)
uses otel_gil's protocol and ring; otel_gil, installed into every app, never imports it."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    root_side = {p.stem for p in (ROOT / "collector").glob("*.py")}
    assert {"attach", "report", "top", "timeline", "cli", "server", "tracer", "probes"} <= root_side
    assert not {p.stem for p in (ROOT / "otel_gil").glob("*.py")} & {"attach", "report", "top", "timeline", "cli"}
