"""Settings of the Django example: no database, no apps, just views."""

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "gilsite.urls"
WSGI_APPLICATION = "gilsite.wsgi.application"
INSTALLED_APPS: list[str] = []
MIDDLEWARE = ["gilsite.middleware.start_hog"]  # opentelemetry-instrument puts its own first
DATABASES: dict[str, dict] = {}
USE_TZ = True
