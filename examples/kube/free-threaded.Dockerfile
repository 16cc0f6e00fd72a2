# A free-threaded CPython for the cluster test's app (scripts/kube.py free_threaded_image): the
# build context is scripts/freethreaded.sh's prefix, copied to the same path (its rpath), on the
# Debian libraries it was built against (python:3.11-slim-bookworm's: bookworm, as this host).
# Its OpenSSL looks for CAs under /usr/lib/ssl, which that image lacks (no openssl package).
FROM docker.io/library/python:3.11-slim-bookworm
ARG PREFIX
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
COPY . $PREFIX
