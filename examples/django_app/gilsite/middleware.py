"""Start the GIL hog on a process's first request, like the Flask app's ``before_request``."""

from typing import Callable

from django.http import HttpRequest, HttpResponse

import workload


def start_hog(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """Middleware: each process (each gunicorn worker) starts its own ``metrics-collector``."""

    def middleware(request: HttpRequest) -> HttpResponse:
        workload.ensure_hog()
        return get_response(request)

    return middleware
