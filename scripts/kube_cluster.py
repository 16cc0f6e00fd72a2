"""A real single-node Kubernetes on this machine: etcd (Debian's), kube-apiserver,
kube-controller-manager, kube-scheduler and a kubelet (built from k8s.io/kubernetes by
scripts/kube-bin.sh) on containerd (Debian's, runc, CNI bridge + host-local), certificates made
here, no registry: images come from the local engine (``load``). No kube-proxy and no DNS: the
apiserver reaches webhooks at their endpoints (--enable-aggregator-routing), Pods reach the node
at its IP (status.hostIP, the Operator's OTEL_NODE_IP) and the apiserver there.

    python3 scripts/kube_cluster.py up           (make kube-cluster) start it; last lines: how to reach it
    python3 scripts/kube_cluster.py load IMAGE   (make kube-load IMAGE=...) the engine's image onto the node
    python3 scripts/kube_cluster.py down         (make kube-cluster-down) stop it: no process, mount,
                                                 veth, bridge, cgroup or iptables chain of it is left
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("OTEL_GIL_CACHE", "/var/cache/otel-gil"))
STATE = Path("/var/lib/otel-gil-kube")  # certificates, kubelet's root: removed by down
RUN = Path("/run/otel-gil-kube")  # sockets, logs, pids, etcd's data, containerd's state: removed by down
IMAGES = CACHE / "kube-containerd"  # containerd's root: the node's images, kept like the other caches
KUBECONFIG = STATE / "admin.conf"
NODE = "otel-gil-node"
BRIDGE, POD_CIDR, GATEWAY = "otelgil0", "10.244.0.0/24", "10.244.0.1"
SERVICE_CIDR = "10.96.0.0/24"
APISERVER_PORT, ETCD_PORT = 6443, 23790
PAUSE_IMAGE = "localhost/otel-gil/pause:catatonit"  # the sandbox image: Debian's static catatonit, as podman's
# The kubelet sets these at start unless protectKernelDefaults (which refuses to start if they differ): down restores them.
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
KUBELET_FIXED = Path("/var/lib/kubelet")  # its device-plugins socket's, whatever --root-dir says
LOADED_FROM = "otel-gil.engine-image-id"  # the label of a node image: the engine's image it was loaded from
COMPONENTS = ("containerd", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


class ClusterError(RuntimeError):
    """A part did not start; the message ends with its log."""


def run(*argv: str, stdin: bytes | None = None, check: bool = True, timeout: float = 300) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
    if check and done.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed:\n{done.stdout.decode()}{done.stderr.decode()}")
    return done.stdout.decode()


def binaries(what: str = "kubernetes") -> Path:
    """scripts/kube-bin.sh's directory of ``what``, built first when missing (it says so on stderr)."""
    done = subprocess.run([str(ROOT / "scripts" / "kube-bin.sh"), "dir", what], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise ClusterError(f"scripts/kube-bin.sh dir {what} failed (its messages above)")
    return Path(done.stdout.strip())


def node_ip() -> str:
    """The node's first global IPv4 address (Pods reach the node there), not the Pods' bridge's."""
    for line in run("ip", "-4", "-o", "addr", "show", "scope", "global").splitlines():
        fields = line.split()
        if fields[1] != BRIDGE:
            return fields[3].split("/")[0]
    raise ClusterError("this machine has no global IPv4 address for the node")


def kubectl(*args: str, stdin: bytes | None = None, check: bool = True, timeout: float = 120) -> str:
    return run(str(binaries() / "kubectl"), "--kubeconfig", str(KUBECONFIG), *args, stdin=stdin, check=check,
               timeout=timeout)


def ctr(*args: str, stdin: bytes | None = None, check: bool = True) -> str:
    return run("ctr", "--address", str(RUN / "containerd.sock"), "-n", "k8s.io", *args, stdin=stdin, check=check,
               timeout=600)


# Certificates ---------------------------------------------------------------------------------------

def certificates(ip: str) -> None:
    """A CA, the apiserver's serving certificate, one client certificate of system:masters (every
    component here uses it; the Node authorizer's own is not needed on one node), the service
    account key."""
    pki = STATE / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    if (pki / "admin.crt").exists():
        return
    ssl = ("openssl",)
    run(*ssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=otel-gil-kube-ca",
        "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"))
    sans = f"IP:127.0.0.1,IP:{ip},IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc"
    for name, subject, ext in (("apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}"),
                               ("admin", "/O=system:masters/CN=otel-gil-admin", "extendedKeyUsage=clientAuth")):
        run(*ssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(pki / f"{name}.key"),
            "-out", str(pki / f"{name}.csr"))
        run(*ssl, "x509", "-req", "-in", str(pki / f"{name}.csr"), "-CA", str(pki / "ca.crt"), "-CAkey",
            str(pki / "ca.key"), "-CAcreateserial", "-days", "3650", "-extfile", "/dev/stdin",
            "-out", str(pki / f"{name}.crt"), stdin=ext.encode())
    run(*ssl, "genrsa", "-out", str(pki / "sa.key"), "2048")
    run(*ssl, "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def kubeconfig() -> None:
    pki = STATE / "pki"
    KUBECONFIG.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "otel-gil",
        "clusters": [{"name": "otel-gil", "cluster": {"server": f"https://127.0.0.1:{APISERVER_PORT}",
                                                       "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": "admin", "user": {"client-certificate": str(pki / "admin.crt"),
                                             "client-key": str(pki / "admin.key")}}],
        "contexts": [{"name": "otel-gil", "context": {"cluster": "otel-gil", "user": "admin"}}]}, indent=1))


# Components ----------------------------------------------------------------------------------------

def start(name: str, argv: list[str]) -> None:
    """``argv`` in its own session, its log at RUN/logs/NAME.log, its pid at RUN/pids/NAME."""
    (RUN / "logs").mkdir(parents=True, exist_ok=True)
    (RUN / "pids").mkdir(parents=True, exist_ok=True)
    with open(RUN / "logs" / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    (RUN / "pids" / name).write_text(str(proc.pid))


def log_tail(name: str, lines: int = 30) -> str:
    path = RUN / "logs" / f"{name}.log"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def wait(name: str, ready, timeout: float = 120) -> None:
    """Until ``ready()`` is true; ClusterError with NAME's log if its process ended or at ``timeout``."""
    deadline = time.monotonic() + timeout
    pid = int((RUN / "pids" / name).read_text())
    while not ready():
        if not alive(pid):
            raise ClusterError(f"{name} exited:\n{log_tail(name)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{name} not ready within {timeout:.0f} s:\n{log_tail(name)}")
        time.sleep(0.5)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def https_ok(url: str) -> bool:
    import ssl
    pki = STATE / "pki"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def containerd_config() -> Path:
    path = RUN / "containerd.toml"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    path.write_text(f"""version = 2
root = "{IMAGES}"
state = "{RUN / 'containerd'}"
[grpc]
  address = "{RUN / 'containerd.sock'}"
[ttrpc]
  address = "{RUN / 'containerd.sock.ttrpc'}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  # this VM withholds CAP_SYS_RESOURCE even from root: no score below containerd's own (the sandbox's -998)
  restrict_oom_score_adj = true
[{cri}.cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "{RUN / 'cni'}"
[{cri}.containerd]
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
""")
    (RUN / "cni").mkdir(parents=True, exist_ok=True)
    (RUN / "cni" / "10-otel-gil.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "otel-gil", "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(RUN / "cni-ipam"), "routes": [{"dst": "0.0.0.0/0"}],
                      "ranges": [[{"subnet": POD_CIDR, "gateway": GATEWAY}]]}}]}, indent=1))
    return path


def kubelet_config() -> Path:
    pki = STATE / "pki"
    path = STATE / "kubelet.yaml"
    path.write_text(json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{RUN / 'containerd.sock'}",
        "podLogsDir": str(STATE / "pod-logs"),
        "makeIPTablesUtilChains": False,
        # No registry: a garbage-collected image could never come back, and this disk is shared.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "readOnlyPort": 0, "serializeImagePulls": False, "resolvConf": "/etc/resolv.conf",
    }, indent=1))
    return path


def up() -> None:
    if (RUN / "pids" / "kubelet").exists():
        print("kube-cluster: already up (make kube-cluster-down stops it)")
        print_access()
        return
    bin_dir, ip = binaries(), node_ip()
    STATE.mkdir(parents=True, exist_ok=True)
    RUN.mkdir(parents=True, exist_ok=True)
    if not KUBELET_FIXED.exists():
        (RUN / "made-var-lib-kubelet").touch()  # down removes it then
    (RUN / "sysctls.json").write_text(json.dumps({k: Path(f"/proc/sys/{k}").read_text() for k in SYSCTLS}))
    certificates(ip)
    kubeconfig()
    pki = STATE / "pki"
    started = time.monotonic()
    start("containerd", ["containerd", "--config", str(containerd_config())])
    wait("containerd", lambda: (RUN / "containerd.sock").exists())
    wait("containerd", lambda: "Server:" in ctr("version", check=False))
    import_once(PAUSE_IMAGE, lambda: scratch_archive(PAUSE_IMAGE, Path("/usr/bin/catatonit"), ["/catatonit", "-P"]))
    start("etcd", ["etcd", "--name", NODE, "--data-dir", str(RUN / "etcd"),
                   "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                   "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                   "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 10}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PORT + 10}",
                   "--initial-cluster", f"{NODE}=http://127.0.0.1:{ETCD_PORT + 10}"])
    wait("etcd", lambda: http_ok(f"http://127.0.0.1:{ETCD_PORT}/health"))
    start("kube-apiserver", [
        str(bin_dir / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
        "--bind-address=0.0.0.0", f"--secure-port={APISERVER_PORT}", f"--advertise-address={ip}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--kubelet-client-certificate={pki / 'admin.crt'}", f"--kubelet-client-key={pki / 'admin.key'}",
        f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc", f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC", "--allow-privileged=true", "--enable-aggregator-routing=true",
        "--kubelet-preferred-address-types=InternalIP",  # the node's name resolves nowhere
        "--profiling=false"])
    wait("kube-apiserver", lambda: https_ok(f"https://127.0.0.1:{APISERVER_PORT}/readyz"), timeout=180)
    start("kube-controller-manager", [
        str(bin_dir / "kube-controller-manager"), f"--kubeconfig={KUBECONFIG}", "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        "--use-service-account-credentials=false", "--bind-address=127.0.0.1", "--profiling=false"])
    start("kube-scheduler", [str(bin_dir / "kube-scheduler"), f"--kubeconfig={KUBECONFIG}", "--leader-elect=false",
                             "--bind-address=127.0.0.1", "--profiling=false"])
    start("kubelet", [str(bin_dir / "kubelet"), f"--config={kubelet_config()}", f"--kubeconfig={KUBECONFIG}",
                      f"--root-dir={STATE / 'kubelet'}", f"--cert-dir={STATE / 'kubelet-pki'}",
                      f"--hostname-override={NODE}", f"--node-ip={ip}"])
    wait("kubelet", lambda: "True" in kubectl("get", "node", NODE, "-o",
                                              "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False),
         timeout=180)
    wait("kube-controller-manager", lambda: kubectl("get", "serviceaccount", "default", check=False) != "")
    print(f"kube-cluster: up in {time.monotonic() - started:.0f} s (node {NODE} at {ip}; logs in {RUN / 'logs'})")
    print_access()


def http_ok(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def print_access() -> None:
    print(f"export KUBECONFIG={KUBECONFIG}")
    print(f"export PATH={binaries()}:$PATH")


# Images --------------------------------------------------------------------------------------------

def scratch_archive(tag: str, binary: Path, entrypoint: list[str]) -> bytes:
    """A docker-archive of a one-file image: the statically linked ``binary`` at /NAME, run as ``entrypoint``."""
    data = binary.read_bytes()
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo(binary.name)
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({"architecture": {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine], "os": "linux",
                         "config": {"Entrypoint": entrypoint}, "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, content in (("layer.tar", layer_bytes), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return archive.getvalue()


def import_once(tag: str, archive) -> None:
    """``archive()``'s image onto the node unless it is there."""
    if tag not in ctr("images", "ls", "-q").split():
        ctr("images", "import", "-", stdin=archive())


def load(image: str, engine: str = "podman") -> None:
    """The engine's ``image`` onto the node (podman save | ctr import): no registry involved. Not
    again while the node's image (kept with its cache) is labelled with the engine image's ID."""
    image_id = run(engine, "image", "inspect", "--format", "{{.Id}}", image).strip()
    if any(line.split()[0] == image and f"{LOADED_FROM}={image_id}" in line
           for line in ctr("images", "ls").splitlines()[1:]):
        print(f"kube-cluster: {image} is on the node already")
        return
    saved = subprocess.run([engine, "save", image], capture_output=True, timeout=600)
    if saved.returncode != 0:
        raise ClusterError(f"{engine} save {image} failed:\n{saved.stderr.decode()}")
    try:
        ctr("images", "import", "-", stdin=saved.stdout)
    except ClusterError as exc:
        # containerd's garbage collector may remove a layer shared with the image this one replaces
        # while the import unpacks onto it ("parent snapshot ... does not exist"): once more, then it is kept.
        if "snapshot" not in str(exc):
            raise
        print(f"kube-cluster: importing {image} again: {str(exc).splitlines()[-1][:200]}")
        ctr("images", "import", "-", stdin=saved.stdout)
    ctr("images", "label", image, f"{LOADED_FROM}={image_id}")
    print(f"kube-cluster: {image} is on the node")


# Down ----------------------------------------------------------------------------------------------

def mounts_below(*dirs: Path) -> list[str]:
    """Mount points under ``dirs``, deepest first."""
    points = [line.split()[4].replace("\\040", " ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if any(p == str(d) or p.startswith(f"{d}/") for d in dirs)),
                  key=len, reverse=True)


def down() -> None:
    pids = RUN / "pids"
    if (pids / "kubelet").exists():
        stop(int((pids / "kubelet").read_text()))  # first: it would restart what is killed below
    if (RUN / "containerd.sock").exists():  # every container the node ran
        try:  # one ctr for all (one each took 1 s on a loaded host)
            if tasks := ctr("tasks", "ls", "-q", check=False).split():
                ctr("tasks", "rm", "-f", *tasks, check=False)  # SIGKILL, then delete: its shim exits with it
            if containers := ctr("containers", "ls", "-q", check=False).split():
                ctr("containers", "rm", *containers, check=False)
        except subprocess.TimeoutExpired:
            pass
    for name in reversed(COMPONENTS):
        if (pids / name).exists():
            stop(int((pids / name).read_text()))
    for shim in shims():  # one whose task could not be removed
        stop(shim, group=False)
    for point in mounts_below(RUN, STATE, IMAGES):  # netns (state dir), shm, overlays, kubelet's volumes
        subprocess.run(["umount", "-l", point], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)  # its veths went with their netns
    remove_cgroups()
    remove_iptables_chains()
    if (RUN / "sysctls.json").exists():
        for key, value in json.loads((RUN / "sysctls.json").read_text()).items():
            Path(f"/proc/sys/{key}").write_text(value)
    if (RUN / "made-var-lib-kubelet").exists():
        shutil.rmtree(KUBELET_FIXED, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(STATE, ignore_errors=True)
    print("kube-cluster: down")


def shims() -> list[int]:
    """The pids of the runc shims of this node's containerd (they leave its process group)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"containerd-shim-runc-v2") and str(RUN / "containerd.sock").encode() in argv:
            found.append(int(proc.name))
    return found


def stop(pid: int, timeout: float = 15, group: bool = True) -> None:
    """SIGTERM the process group we started (or the process), then SIGKILL what is left of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig) if group else os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)


def remove_cgroups() -> None:
    """The kubelet's kubepods hierarchy (cgroupfs driver) in every mounted hierarchy, innermost first."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / "kubepods"
        if top.is_dir():
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                                    reverse=True) + [top]:
                try:
                    directory.rmdir()
                except OSError:
                    pass


def remove_iptables_chains() -> None:
    """The KUBE-* chains the kubelet makes whatever makeIPTablesUtilChains says (its canaries and hints)."""
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = run(tool, "-t", table, "-S", check=False).splitlines()
            chains = [line.split()[1] for line in rules if line.startswith("-N KUBE-")]
            for rule in rules:  # jumps to them from the built-in chains
                if rule.startswith("-A ") and not rule.split()[1].startswith("KUBE-") and "KUBE-" in rule:
                    run(tool, "-t", table, "-D", *rule.split()[1:], check=False)
            for chain in chains:
                run(tool, "-t", table, "-F", chain, check=False)
            for chain in chains:
                run(tool, "-t", table, "-X", chain, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down", "load"))
    parser.add_argument("image", nargs="?")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("kube-cluster: containerd, the kubelet and their mounts need root: run it as root (make uses sudo)")
    try:
        if args.command == "up":
            up()
        elif args.command == "down":
            down()
        else:
            load(args.image or sys.exit("kube-cluster: load IMAGE"))
    except ClusterError as exc:
        print(f"kube-cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
