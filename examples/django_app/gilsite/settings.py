"""Settings of the Django example: no database, no apps, just views."""

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "gilsite.urls"
WSGI_APPLICATION = "gilsite.wsgi.application"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict = {}
USE_TZ = True
