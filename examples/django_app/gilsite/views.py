"""The Django example's views, the same work as the Flask app's (examples/workload.py)."""

from django.http import HttpRequest, HttpResponse

import workload


def io(request: HttpRequest) -> HttpResponse:
    """Blocking waits: slow only when another thread keeps the GIL."""
    return HttpResponse(workload.io_bound())


def cpu(request: HttpRequest) -> HttpResponse:
    """Pure-Python work."""
    return HttpResponse(workload.cpu_bound())


def slow_c(request: HttpRequest) -> HttpResponse:
    """A C call that holds the GIL."""
    return HttpResponse(workload.slow_c())


def blocked(request: HttpRequest) -> HttpResponse:
    """Waits out another thread's known hold of the GIL (a ground truth)."""
    return HttpResponse(workload.blocked())


def health(request: HttpRequest) -> HttpResponse:
    """Liveness."""
    return HttpResponse(workload.health())
