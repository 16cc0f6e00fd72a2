"""Settings of the Django example: no database, no apps, just views.

``DJANGO_ALLOWED_HOSTS`` (comma-separated, default ``127.0.0.1,localhost``) lets it answer
under other host names, e.g. a compose service's.
"""

import os

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")
ROOT_URLCONF = "gilsite.urls"
WSGI_APPLICATION = "gilsite.wsgi.application"
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["gilsite.middleware.start_hog"]  # opentelemetry-instrument puts its own first
DATABASES: dict[str, dict[str, str]] = {}  # no database
USE_TZ = True
