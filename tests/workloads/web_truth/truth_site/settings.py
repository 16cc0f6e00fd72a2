"""Django for the ground truth: under ASGI (uvicorn) and on gevent workers (gunicorn)."""

SECRET_KEY = "otel-gil-tests"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "truth_site.urls"
INSTALLED_APPS: list = []
MIDDLEWARE: list = []
DATABASES: dict = {}
USE_TZ = True
