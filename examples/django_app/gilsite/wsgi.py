"""WSGI entry point: gunicorn gilsite.wsgi (from examples/django_app)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gilsite.settings")
application = get_wsgi_application()
