"""WSGI entry point: ``gunicorn gilsite.wsgi`` from examples/django_app (or with ``--chdir``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gilsite.settings")
application = get_wsgi_application()
