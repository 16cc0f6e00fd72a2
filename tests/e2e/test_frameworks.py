"""Flask and Django under opentelemetry-instrument, zero code change, spans read back
from a real Jaeger: GIL figures on server spans, high wait while the metrics thread
hogs the GIL, low without it, and the hog named as the blocker."""

import pytest

from helpers import drive, median_tag, server_spans

from otel_gil.semconv import ALWAYS

REQUESTS = 40


@pytest.mark.parametrize("framework, server", [("flask", "dev"), ("django", "dev")])
def test_hog_shows_up_as_gil_wait_and_vanishes_without_it(app, backend, framework, server):
    with_hog = f"{framework}-hog"
    svc = app(framework, server, with_hog, hog=True)
    with_hog += f"-{backend}"
    drive(svc.address, "/io", REQUESTS, concurrency=1)  # one request at a time: the hog is the other thread
    operation = "GET /io" if framework == "flask" else "GET io"  # Django names spans by its URL pattern
    hog_spans = server_spans(with_hog, operation, REQUESTS)
    svc.stop()

    without = f"{framework}-nohog"
    svc = app(framework, server, without, hog=False)
    without += f"-{backend}"
    drive(svc.address, "/io", REQUESTS, concurrency=1)
    calm_spans = server_spans(without, operation, REQUESTS)

    for span in hog_spans + calm_spans:
        tags = span["tags"]
        for key in ALWAYS:  # the counters are there only where not 0
            assert key in tags, (key, tags)
        assert "gil.status" not in tags, tags
    assert median_tag(hog_spans, "gil.wait_ratio") > 0.3
    assert median_tag(calm_spans, "gil.wait_ratio") < 0.1
    blockers = [
        field["value"]
        for span in hog_spans
        for log in span.get("logs", [])
        for field in log["fields"]
        if field["key"] == "gil.blocker.thread.name"
    ]
    assert blockers and blockers.count("metrics-collector") >= 0.8 * len(blockers), blockers
