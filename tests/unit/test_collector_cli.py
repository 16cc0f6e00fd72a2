"""The collector's command line as a DaemonSet uses it: --socket-group takes a group's name or a
numeric GID (a Pod's supplementalGroups has no name inside the collector's container); --probe
(readiness, liveness) says whether a collector answers and the kernel opens a uprobe."""

import grp
import os
import socket

import pytest

from otel_gil_collector.__main__ import main, socket_gid


def test_numeric_gid_is_taken_as_is():
    unnamed = next(gid for gid in range(43000, 44000) if gid not in {g.gr_gid for g in grp.getgrall()})
    assert socket_gid(str(unnamed)) == unnamed


def test_name_is_looked_up():
    group = grp.getgrgid(os.getgid())
    assert socket_gid(group.gr_name) == group.gr_gid


@pytest.mark.parametrize("group, said", [("no-such-group-here", "no group named 'no-such-group-here'"),
                                         ("4294967295", "GID 4294967295 is out of range")])
def test_refused_with_why(group, said, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--socket-group", group])
    assert exited.value.code == 2
    assert f"--socket-group: {said}" in capsys.readouterr().err


def test_probe_says_no_collector_answers(tmp_path, capsys):
    """The DaemonSet's readiness and liveness: no collector on the socket, exit 1 and why."""
    path = tmp_path / "otel-gil.sock"
    assert main(["--probe", "--socket", str(path)]) == 1
    assert capsys.readouterr().err == (f"otel-gil-collector --probe: no collector answers on {path}: "
                                       "No such file or directory\n")


def test_probe_passes_while_a_collector_accepts(tmp_path, capsys):
    """A socket listening as the collector's does (SOCK_SEQPACKET) and a uprobe the kernel opens
    (root): exit 0, nothing said."""
    if os.geteuid() != 0:
        pytest.fail("the probe's uprobe needs root (CAP_SYS_ADMIN here): run as root, as CI does")
    path = tmp_path / "otel-gil.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(str(path))
        listener.listen()
        assert main(["--probe", "--socket", str(path)]) == 0
    assert capsys.readouterr().err == ""
