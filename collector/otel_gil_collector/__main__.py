"""otel-gil-collector: trace the GIL of the Python processes that register with it.

Runs as root (bcc compiles and loads an eBPF program). Apps register over a Unix
socket with ``otel_gil``; each gets uprobes on its own pid only and a read-only
shared-memory view of its own per-thread GIL figures.

Examples:
    sudo otel-gil-collector
    sudo otel-gil-collector --socket /tmp/otel-gil.sock -v
    sudo otel-gil-collector --socket-group www-data   # only that group's apps may register
    sudo otel-gil-collector --socket-group 2000       # by GID (a Pod's supplementalGroups)
    otel-gil-collector --probe                        # a running collector's health (Kubernetes probes)
    sudo /usr/bin/python3 -m otel_gil_collector --socket /run/otel-gil/otel-gil.sock
"""

from __future__ import annotations

import argparse
import errno
import grp
import logging
import os
import platform
import resource
import signal
import socket
import sys

from otel_gil.environment_variables import DEFAULT_SOCKET
from otel_gil_collector import uprobe_check

_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_SYS_PTRACE, _CAP_SYS_ADMIN, _CAP_PERFMON, _CAP_BPF = 1, 2, 19, 21, 38, 39
_CAPABILITY_NAMES = {_CAP_SYS_PTRACE: "CAP_SYS_PTRACE", _CAP_SYS_ADMIN: "CAP_SYS_ADMIN", _CAP_PERFMON: "CAP_PERFMON",
                     _CAP_BPF: "CAP_BPF", _CAP_DAC_READ_SEARCH: "CAP_DAC_READ_SEARCH"}
_BCC_PATHS = ("/usr/lib/python3/dist-packages", "/usr/lib64/python3/site-packages")
FDS_PER_PROCESS = 6  # a registered process: connection, pidfd, ring, three uprobes
FDS_RESERVED = 256  # connections waiting for a hello, planner workers, bcc, uprobes being closed


class PreflightError(SystemExit):
    """A missing prerequisite; the message says how to fix it."""


def _effective_caps() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _last_cap() -> int:
    """The kernel's highest capability: below CAP_BPF (kernels before 5.8), CAP_SYS_ADMIN stands for it and CAP_PERFMON."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return _CAP_BPF


def missing_capabilities(caps: int, last_cap: int, uprobes_refused: bool) -> list[str]:
    """The capabilities the collector needs and ``caps`` lacks: to open uprobes (CAP_SYS_ADMIN
    where the kernel refuses them without it: ``uprobes_refused``), to load its program
    (CAP_BPF; the kernel refuses it without CAP_PERFMON; CAP_SYS_ADMIN covers both) and to
    attach to processes of another uid or that hold capabilities it has not (CAP_SYS_PTRACE: a
    root app in a container), whose files it names by /proc/PID/map_files/, a directory of mode
    0500 owned by their uid (CAP_DAC_READ_SEARCH; CAP_DAC_OVERRIDE covers it)."""
    held = {bit for bit in _CAPABILITY_NAMES if caps & (1 << bit)}
    if caps & (1 << _CAP_DAC_OVERRIDE):
        held.add(_CAP_DAC_READ_SEARCH)
    if _CAP_SYS_ADMIN in held:
        needed = []
    elif uprobes_refused or last_cap < _CAP_BPF:
        needed = [_CAP_SYS_ADMIN]
    else:
        needed = [_CAP_BPF, _CAP_PERFMON]
    return [_CAPABILITY_NAMES[bit] for bit in [*needed, _CAP_SYS_PTRACE, _CAP_DAC_READ_SEARCH] if bit not in held]


def _check_privileges() -> None:
    caps = _effective_caps()
    refused = uprobe_check.refusal() is not None
    missing = missing_capabilities(caps, _last_cap(), refused)
    if not missing:
        return
    if os.geteuid() != 0 and not caps:
        raise PreflightError("otel-gil-collector needs root (or CAP_SYS_ADMIN + CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH): "
                             "run it with sudo")
    why = " (this kernel opens uprobes only with CAP_SYS_ADMIN)" if refused and "CAP_SYS_ADMIN" in missing else ""
    raise PreflightError(f"otel-gil-collector lacks {' and '.join(missing)}{why}: add {'it' if len(missing) == 1 else 'them'} "
                         "to its capabilities (Kubernetes: securityContext.capabilities.add, as "
                         "deploy/kubernetes/collector-daemonset.yaml does), or run it as root with all of them")


def _import_bcc() -> None:
    """Import bcc, also from the system's dist-packages when run from a virtualenv."""
    try:
        import bcc  # noqa: F401
        return
    except ImportError:
        pass
    for path in _BCC_PATHS:
        if os.path.isdir(os.path.join(path, "bcc")):
            sys.path.append(path)
            try:
                import bcc  # noqa: F401
                return
            except ImportError:
                sys.path.remove(path)
    raise PreflightError(
        "otel-gil-collector needs bcc's Python bindings: install them with "
        "'sudo apt install python3-bpfcc' (Debian/Ubuntu) or 'sudo dnf install python3-bcc' (Fedora)"
    )


def _check_kernel() -> None:
    release = platform.release()
    if not (os.path.exists(f"/lib/modules/{release}/build") or os.path.exists("/sys/kernel/kheaders.tar.xz")):
        raise PreflightError(
            f"bcc needs the headers of kernel {release} and finds none: install them "
            f"('sudo apt install linux-headers-{release}' or 'sudo dnf install kernel-devel-{release}'), "
            f"or 'sudo modprobe kheaders'. Without a package for this kernel, install the nearest "
            f"linux-headers-<version>-<flavour> and link /lib/modules/{release}/build to its "
            f"/usr/src/linux-headers-<version>-<flavour> and /lib/modules/{release}/source to the matching -common dir"
        )
    if not os.path.exists("/sys/bus/event_source/devices/uprobe/type"):
        raise PreflightError("this kernel has no uprobe support (CONFIG_UPROBE_EVENTS): otel-gil cannot trace the GIL")
    if not os.path.exists("/sys/fs/bpf") and not os.path.exists("/proc/sys/kernel/unprivileged_bpf_disabled"):
        raise PreflightError("this kernel has no BPF syscall (CONFIG_BPF_SYSCALL): otel-gil cannot trace the GIL")


def fd_budget(max_processes: int, log: logging.Logger) -> int:
    """Raise the soft fd limit to the hard one; the --max-processes that fits in it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limit = hard if hard != resource.RLIM_INFINITY else 1 << 20
    fits = (limit - FDS_RESERVED) // FDS_PER_PROCESS
    if fits < 1:
        raise PreflightError(
            f"otel-gil-collector: the file descriptor limit ({limit}) is too low; raise it "
            f"(ulimit -n, systemd LimitNOFILE=) to at least {FDS_RESERVED + 16 * FDS_PER_PROCESS}"
        )
    if max_processes > fits:
        log.warning("--max-processes %d lowered to %d: %d fds per process fit in the fd limit of %d "
                    "(raise it with ulimit -n / LimitNOFILE=)", max_processes, fits, FDS_PER_PROCESS, limit)
    return min(max_processes, fits)


def probe(path: str) -> int:
    """0 if a collector accepts on ``path`` and a uprobe opens here, else 1 with why on stderr."""
    why = None
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:  # the collector's type (server.py)
        conn.settimeout(2)
        try:
            conn.connect(path)  # closed before its hello: the collector drops it without a word
        except OSError as exc:
            why = f"no collector answers on {path}: {exc.strerror or exc}"
    if why is None and (refused := uprobe_check.refusal()) is not None:
        why = f"the kernel refuses a uprobe here: {errno.errorcode.get(refused, refused)}"
    if why:
        print(f"otel-gil-collector --probe: {why}", file=sys.stderr)
    return 1 if why else 0


def socket_gid(group: str) -> int:
    """A group name's GID, or a numeric GID as is (a container has no entry for a Pod's
    supplementalGroups); ValueError names what is wrong."""
    if group.isascii() and group.isdigit():
        gid = int(group)
        if gid >= 2**32 - 1:  # (gid_t)-1 means "unchanged" to chown
            raise ValueError(f"GID {group} is out of range")
        return gid
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"no group named {group!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="otel-gil-collector",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help=f"registration socket (default {DEFAULT_SOCKET})")
    parser.add_argument(
        "--max-threads", type=int, default=2048, help="thread slots per process (default 2048)"
    )
    parser.add_argument(
        "--max-processes", type=int, default=1024, help="registered processes at once (default 1024)"
    )
    parser.add_argument(
        "--max-processes-per-uid", type=int, default=512,
        help="GIL rings one uid may hold at once, registered processes included (default 512)",
    )
    parser.add_argument(
        "--plan-timeout", type=float, default=10.0,
        help="seconds the collector may spend examining one process's interpreter files (default 10)",
    )
    parser.add_argument(
        "--socket-group",
        help="only this group (a name or a numeric GID) may register (socket mode 0660); default: "
        "any local user (0666), each process only ever gets its own figures",
    )
    parser.add_argument(
        "--probe", action="store_true",
        help="exit 0 if a collector answers on --socket and the kernel opens this process a uprobe, "
        "else say why and exit 1 (a DaemonSet's readiness and liveness)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every registration detail")
    args = parser.parse_args(argv)
    if args.probe:
        return probe(args.socket)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s otel-gil-collector %(levelname)s %(message)s",
    )
    if not 16 <= args.max_threads <= 65536 or not 1 <= args.max_processes <= 65536:
        parser.error("--max-threads must be in 16..65536 and --max-processes in 1..65536")
    if not 1 <= args.max_processes_per_uid <= 65536 or not 0.1 <= args.plan_timeout <= 600:
        parser.error("--max-processes-per-uid must be in 1..65536 and --plan-timeout in 0.1..600")
    try:
        group = None if args.socket_group is None else socket_gid(args.socket_group)
    except ValueError as exc:
        parser.error(f"--socket-group: {exc}")
    try:
        _check_privileges()
        _import_bcc()
        _check_kernel()
        from otel_gil_collector.server import Server
        from otel_gil_collector.tracer import Tracer

        log = logging.getLogger("otel_gil.collector")
        max_processes = fd_budget(args.max_processes, log)
        log.info("compiling the BPF program (a few seconds)...")
        try:
            tracer = Tracer(args.max_threads, max_processes)
        except Exception as exc:
            raise PreflightError(f"otel-gil-collector: loading the BPF program failed: {exc}") from None
    except PreflightError as exc:
        print(exc.code if isinstance(exc.code, str) else exc, file=sys.stderr)
        return 2
    server = Server(args.socket, tracer, 0o666 if group is None else 0o660, group,
                    args.max_processes_per_uid, args.plan_timeout)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    log.info("listening on %s", args.socket)
    try:
        server.serve()
    finally:
        server.close()
        tracer.close()
        log.info("stopped: all probes detached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
