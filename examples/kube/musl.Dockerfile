# The Flask example on waitress on musl, with no OpenTelemetry (the cluster test's musl app; the
# Operator's webhook brings /autoinstrumentation-musl): nothing but musl's libc (Debian's, as the
# loader), scripts/musl-python.sh's CPython in /usr/local (a static libpython: it finds its stdlib
# from where it runs) and a venv /opt/wsgi of Flask and waitress, their musllinux wheels installed on
# the host (pip install --target). The build context is made by scripts/kube.py's musl_image: libc.so,
# python/ (the interpreter's prefix), site-packages/, bin/ (waitress-serve), examples/.
FROM scratch
COPY libc.so /lib/ld-musl-x86_64.so.1
COPY python/ /usr/local/
COPY site-packages/ /opt/wsgi/lib/python3.13/site-packages/
COPY bin/ /opt/wsgi/bin/
# No shell here: the image's own CPython makes the venv and a /tmp (tempfile's).
RUN ["/usr/local/bin/python3.13", "-c", "import os, venv; venv.create('/opt/wsgi', symlinks=True); os.mkdir('/tmp'); os.chmod('/tmp', 0o1777)"]
ENV PATH=/opt/wsgi/bin:/usr/local/bin
WORKDIR /opt/otel-gil
COPY examples/ examples/
