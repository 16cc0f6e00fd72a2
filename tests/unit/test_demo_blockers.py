"""scripts/demo.py's blocker lines on Jaeger's span JSON: a blocker by name, and one whose name
is unknown as a thread with that id (never a bare number, never hidden)."""

import demo  # scripts/ (tests/helpers.py puts it on sys.path)


def _span(tags: dict, events: list[dict]) -> dict:
    return {"operationName": "GET /cpu", "duration": 50_000, "startTime": 1_000,
            "tags": tags, "logs": [{"timestamp": 2_000 + i, "fields": [{"key": k, "value": v} for k, v in e.items()]}
                                   for i, e in enumerate(events)]}


def test_blockers_named_or_said_unknown():
    named = {"gil.wait_ms": 20.0, "gil.blocker.thread.native_id": 11, "gil.blocker.thread.name": "short-hog",
             "gil.blocker.hold_ms": 14.1}
    unnamed = {"gil.wait_ms": 21.0, "gil.blocker.thread.native_id": 26213, "gil.blocker.hold_ms": 20.7}
    span = _span({"gil.top_blocker.thread.native_id": 26213, "gil.top_blocker.hold_ms": 20.7}, [named, unnamed])
    assert demo.blockers(span) == "thread 26213 (name unknown) 20.7ms, short-hog 14.1ms"
    lines = demo.waits(span).splitlines()[1:]
    assert "short-hog held it 14.1ms" in lines[0] and "thread 26213 (name unknown) held it 20.7ms" in lines[1], lines
