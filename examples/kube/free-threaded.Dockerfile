# A free-threaded CPython for the cluster test's app (scripts/kube.py free_threaded_image): the
# build context is scripts/freethreaded.sh's prefix, copied to the same path (its rpath), on the
# Debian libraries it was built against (python:3.11-slim-bookworm's: bookworm, as this host), less
# what free-threaded.dockerignore names. Its OpenSSL finds that image's CAs in /usr/lib/ssl.
FROM docker.io/library/python:3.11-slim-bookworm
ARG PREFIX
COPY . $PREFIX
