"""The Django example's views: no otel-gil code here, opentelemetry-instrument adds it."""

import os
import sys

from django.http import HttpResponse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import workload  # noqa: E402  (examples/workload.py)


def _view(work):
    def view(request):
        workload.ensure_hog()
        return HttpResponse(work())

    view.__name__ = work.__name__
    return view


io = _view(workload.io_bound)
cpu = _view(workload.cpu_bound)
slow_c = _view(workload.slow_c)
health = _view(lambda: "ok")
