"""The collector's socket loop out of file descriptors (no BPF needed: no client gets that far)."""

import os
import subprocess
import sys

from helpers import ROOT

OUT_OF_FDS = r"""
import os, resource, socket, sys, tempfile, threading, time, types
from otel_gil_collector.server import Server
from otel_gil import protocol

path = os.path.join(tempfile.mkdtemp(), "gil.sock")
server = Server(path, types.SimpleNamespace(finish_bootstrap=lambda: None, max_processes=8))
client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
client.settimeout(10)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
filler = []
try:
    while True:
        filler.append(os.dup(0))
except OSError:
    pass
client.connect(path)  # queued in the backlog: accept() fails with EMFILE
serving = threading.Thread(target=server.serve)
serving.start()
cpu0 = time.process_time()
time.sleep(2)
busy = time.process_time() - cpu0
for fd in filler:
    os.close(fd)
client.send(b"garbage")  # once fds are free again, the connection is served
reply, _ = protocol.receive(client)
server.stop()  # as the collector stops: the loop ends, then its planner workers
serving.join()
server.close()
print(busy, reply["error"])
"""


def test_out_of_fds_the_loop_waits_instead_of_spinning():
    done = subprocess.run([sys.executable, "-c", OUT_OF_FDS], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    busy, error = done.stdout.split()
    assert float(busy) < 0.3, f"the loop used {float(busy):.2f} s of CPU in 2 s while out of fds"
    assert error == "bad_request"
    assert "out of file descriptors" in done.stderr


def test_a_process_of_another_uid_is_alive_without_cap_kill(monkeypatch):
    """Without CAP_KILL (the DaemonSet drops it) signal 0 to another uid's process is refused,
    EPERM: it exists (its registration failed with internal_error on the cluster before)."""
    from otel_gil_collector import server

    def refused(pidfd: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(server.signal, "pidfd_send_signal", refused)
    assert server._alive(-1)


def test_a_hello_that_came_while_the_loop_was_busy_is_served_not_dropped(tmp_path, caplog):
    """The loop attaches probes for one process while another's hello arrives: when it comes
    back past that connection's hello deadline, the hello waiting in the socket is served
    (a gunicorn worker got no_collector before); a connection that sent nothing is dropped."""
    import socket
    import types

    from otel_gil import protocol
    from otel_gil_collector.server import Server

    server = Server(str(tmp_path / "gil.sock"), types.SimpleNamespace(finish_bootstrap=lambda: None, max_processes=8))
    try:
        talker, silent = (socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2))
        for client in (talker, silent):
            client.settimeout(5)
            client.connect(server.path)
            server._accept(server._listener)
        talker.send(b"garbage")  # read by the collector only at its next turn of the loop
        for pending in server._pending.values():
            pending.deadline = 0.0  # that turn comes after the deadline: the loop was busy
        server._tick()
        reply, _ = protocol.receive(talker)
        assert reply["error"] == "bad_request", reply
        assert silent.recv(64) == b"", "a connection that sent no hello is dropped"
        assert "dropping a connection that sent no hello" in caplog.text
        assert not server._pending
    finally:
        server.close()
