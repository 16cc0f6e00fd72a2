"""The collector DaemonSet on the real single-node cluster (test_kube_cluster's ``node``): the
chart's collector half installed with helm (its namespace PodSecurity privileged, hostPID), the
collector image loaded from the engine; its Pod goes Ready by its own ``--probe``. An app Pod on
its socket (app-pod.yaml's read-only hostPath, ``supplementalGroups`` = ``--socket-group``'s
numeric GID, uid 10001) gets the collector's figures; the collector Pod deleted, or its process
killed, the app measures in-process until the DaemonSet's next collector registers it again,
and no span is lost."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime
from pathlib import Path
from urllib.error import URLError

import pytest
import yaml

from helpers import KNOWN_WAITS, ROOT, check_known_waits, known_wait_ms
from test_kube_cluster import (JAEGER_IMAGE, PYTHON_IMAGE, app_deployment, app_name, apply, cluster, deployment,
                               helm_install, instrument, kube, kubectl_json, node, pod_of, wait_for)

__all__ = ["node"]  # the cluster, up for this module
SYSTEM = "otel-gil-system"  # the chart's collector.namespace
NAMESPACE = "otel-gil-node-apps"  # an app with the socket's hostPath: PodSecurity privileged too
SOCKET_DIR = cluster.RUN / "otel-gil"  # on the node (down removes it)
SOCKET_GID = 2345  # --socket-group, the app Pod's supplementalGroups: no group of that GID exists
APP, PYTHON = "flask", "3.11"
SERVICE = app_name(APP, PYTHON)
BLOCKED = "GET /blocked"
APP_UID = 10001  # test_kube_cluster's RESTRICTED runAsUser
SWITCH_US = 1_000_000  # a switch of the app's from its log line's (or the collector's) time: no further


def collector_pod(not_uid: str = "", restarts: int = 0, timeout: float = 180) -> dict:
    """The DaemonSet's Pod once Ready (its readiness: ``otel-gil-collector --probe``): another
    than ``not_uid``, its container restarted ``restarts`` times at least."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pod in kubectl_json("-n", SYSTEM, "get", "pods")["items"]:
            status = pod["status"].get("containerStatuses") or [{}]
            if (pod["metadata"]["uid"] != not_uid and "deletionTimestamp" not in pod["metadata"]
                    and status[0].get("ready") and status[0]["restartCount"] >= restarts):
                return pod
        time.sleep(1)
    pods = ("-n", SYSTEM, "-l", "app.kubernetes.io/name")
    described = cluster.kubectl("describe", "pods", *pods, check=False)
    pytest.fail(f"no collector Pod Ready within {timeout:.0f} s:\n{described}"
                f"{cluster.kubectl('logs', '--all-containers', *pods, check=False)}")


def host_pid(pod: dict, container: str) -> int:
    """The host pid of ``container``'s first process (containerd's task)."""
    cid = next(s["containerID"] for s in pod["status"]["containerStatuses"] if s["name"] == container)
    for line in cluster.ctr("tasks", "ls").splitlines()[1:]:
        task, pid, _ = line.split()
        if task == cid.split("://")[1]:
            return int(pid)
    raise AssertionError(f"containerd runs no task {cid}")


def logged_us(log: str, text: str, after_us: int = 0) -> int | None:
    """When (epoch µs) ``log`` (``kubectl logs --timestamps``) first says ``text`` after ``after_us``."""
    for line in log.splitlines():
        stamp, _, said = line.partition(" ")
        whole, _, fraction = stamp.rstrip("Z").partition(".")  # RFC 3339, up to ns, trailing zeros cut
        when = int(datetime.fromisoformat(f"{whole}.{fraction[:6]:0<6}+00:00").timestamp() * 1e6)
        if text in said and when > after_us:
            return when
    return None


def registered(pid: int) -> str:
    """What the collector logs when ``pid`` of the app registers."""
    return f" pid {pid} (uid {APP_UID}) registered: "


def collector_log(pod: dict) -> str:
    return cluster.kubectl("-n", SYSTEM, "logs", "--timestamps", pod["metadata"]["name"])


@pytest.fixture(scope="module")
def daemonset(node):
    """The chart's collector half, as the README installs it, with this repo's collector image
    (the engine's, loaded on the node), its socket directory under the cluster's run directory."""
    started = time.monotonic()
    try:
        kube.build_images()
        for image in (kube.COLLECTOR_IMAGE, PYTHON_IMAGE, kube.app_image(PYTHON), JAEGER_IMAGE):
            cluster.load(image)
    except (cluster.ClusterError, kube.KubeError) as exc:
        pytest.fail(str(exc))
    loaded = time.monotonic()
    helm_install("otel-gil-collector", "default", "instrumentation.enabled=false",
                 f"collector.image={kube.COLLECTOR_IMAGE}", "collector.imagePullPolicy=Never",
                 f"collector.socketDir={SOCKET_DIR}", f"collector.socketGroup={SOCKET_GID}")
    pod = collector_pod()
    print(f"images built and on the node in {loaded - started:.0f} s, the collector Ready "
          f"{time.monotonic() - loaded:.0f} s after")
    return pod


@pytest.fixture(scope="module")
def app(daemonset):
    """Jaeger in the cluster; the Operator and the chart's Instrumentation (exporting to it) in a
    privileged namespace; the Flask example's Deployment there, its Pod template annotated
    inject-python and given app-pod.yaml's socket volume, mount and env (the volume on
    SOCKET_DIR), its group SOCKET_GID, the tree's logging instrumentation off (otel-gil's warnings
    on stderr), once the collector has registered its worker: {url, pod, worker (host pid), jaeger (API base URL)}."""
    jaeger = deployment("jaeger", "default")
    jaeger["spec"]["template"]["spec"]["containers"][0].update(image=JAEGER_IMAGE)
    apply(jaeger)
    ip = wait_for("Jaeger's Pod running", lambda: (p := pod_of("jaeger", "default")) and
                  p["status"].get("phase") == "Running" and p["status"].get("podIP"))
    instrument(NAMESPACE, "privileged", f"instrumentation.endpoint=http://{ip}:4318",
               "instrumentation.metricsExporter=none", "instrumentation.logsExporter=none")
    shipped = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "app-pod.yaml").read_text())["spec"]
    manifest = app_deployment(APP, PYTHON)
    manifest["metadata"]["namespace"] = NAMESPACE
    spec = manifest["spec"]["template"]["spec"]
    spec.update(volumes=shipped["volumes"], securityContext={"supplementalGroups": [SOCKET_GID]})
    spec["volumes"][0]["hostPath"]["path"] = str(SOCKET_DIR)
    container = spec["containers"][0]
    container["env"] += shipped["containers"][0]["env"]
    # The tree's logging instrumentation hands the root logger's records to the logs exporter (none:
    # Jaeger takes traces only), not to stderr: without it otel-gil's warnings reach the Pod's log.
    container["env"].append({"name": "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "value": "logging"})
    container["volumeMounts"] = shipped["containers"][0]["volumeMounts"]
    apply(manifest)
    try:
        cluster.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{SERVICE}", "--timeout=180s", timeout=200)
    except cluster.ClusterError as exc:
        pods = ("-n", NAMESPACE, "-l", f"app={SERVICE}")
        pytest.fail(f"{exc}\n{cluster.kubectl('describe', 'pods', *pods, check=False)}"
                    f"{cluster.kubectl('logs', '--all-containers', *pods, check=False)}")
    base = f"http://{ip}:16686"
    wait_for("Jaeger's API", lambda: kube.stack.http_ok(f"{base}/api/services"))
    pod = pod_of(SERVICE, NAMESPACE)
    master = host_pid(pod, "app")
    children = Path(f"/proc/{master}/task/{master}/children")
    worker = int(children.read_text().split()[0])  # gunicorn -w 1
    # Until then its spans say gil.status=pending (a cold machine's collector attached after the first /blocked)
    wait_for(f"the collector registering the worker (host pid {worker})",
             lambda: logged_us(collector_log(daemonset), registered(worker)),
             seen=lambda: f"gunicorn {master}'s children now: {children.read_text() if children.exists() else 'gone'}\n"
                          f"{app_log({'pod': pod})}\n"
                          f"{cluster.kubectl('-n', SYSTEM, 'get', 'pods', '-o', 'wide', check=False)}"
                          f"{cluster.kubectl('-n', SYSTEM, 'logs', '--timestamps', '-l', 'app.kubernetes.io/name', check=False)}")
    return {"url": f"http://{pod['status']['podIP']}:8000", "pod": pod, "worker": worker, "jaeger": base}


def app_log(app: dict) -> str:
    return cluster.kubectl("-n", NAMESPACE, "logs", "--timestamps", app["pod"]["metadata"]["name"], "-c", "app")


def blocked_spans(app: dict, count: int, since_us: int) -> list[dict]:
    """The app's ``count`` /blocked server spans since ``since_us``, oldest first (fewer: all there are)."""
    spans = kube.stack.wait_for_spans(SERVICE, BLOCKED, count, timeout=60, since_us=since_us, base=app["jaeger"])
    return sorted((s for s in spans if s["operationName"] == BLOCKED and s["tags"].get("span.kind") == "server"),
                  key=lambda s: s["startTime"])


def test_collector_pod_ready_with_host_pid(daemonset):
    """The DaemonSet's Pod on the node is Ready by its readiness probe (a socket that answers, a
    uprobe the kernel opens in the Pod): its collector runs in the host's pid namespace (hostPID
    for real), its socket on the node belongs to the numeric --socket-group."""
    pid = host_pid(daemonset, "collector")
    assert daemonset["spec"]["hostPID"] is True and daemonset["spec"]["nodeName"] == cluster.NODE
    assert os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")  # this test's: the host's
    assert os.stat(SOCKET_DIR / "otel-gil.sock").st_gid == SOCKET_GID
    probe = cluster.kubectl("-n", SYSTEM, "exec", daemonset["metadata"]["name"], "--", "otel-gil-collector", "--probe",
                            "--socket", "/run/otel-gil/otel-gil.sock")
    assert probe == "", probe


def test_app_pod_gets_the_collectors_figures(app, daemonset):
    """The app Pod (uid 10001, the socket's group by supplementalGroups, the mount read-only)
    registers its gunicorn worker with the collector, which names the worker's host pid; its
    /blocked spans, read from Jaeger, wait out the known hold (median, 5 % or 0.5 ms) and name
    gil-holder; the app never traced itself."""
    since = time.time_ns() // 1000
    truths = [known_wait_ms(kube.get_text(f"{app['url']}/blocked")) for _ in range(KNOWN_WAITS)]
    spans = blocked_spans(app, KNOWN_WAITS, since)
    assert len(spans) == KNOWN_WAITS, spans
    check_known_waits([s["tags"] for s in spans], truths)
    assert logged_us(collector_log(daemonset), registered(app["worker"])), (collector_log(daemonset), app_log(app))
    assert "in-process" not in app_log(app), app_log(app)
    print(f"/blocked waits {[s['tags']['gil.wait_ms'] for s in spans]} ms, holds {truths} ms (collector)")


@pytest.mark.parametrize("how", ["delete", "kill -9"])
def test_collector_comes_back_and_no_span_is_lost(app, how):
    """/blocked requests one after another while the collector Pod is deleted (the DaemonSet
    makes another) or its process, found by its host pid, is killed (the kubelet restarts it),
    until the next collector, Ready by its --probe, registered the worker again: every request
    answered, as many /blocked spans in Jaeger as requests; none without figures but those where
    one registration gave way to the other (collector_changed, each straddling a switch); those
    before, during (the app traces itself in-process: its log says so) and after each wait out
    their holds (median, 5 % or 0.5 ms)."""
    old = collector_pod()
    answers: list[float] = []
    failed: list[str] = []
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            try:
                answers.append(known_wait_ms(kube.get_text(f"{app['url']}/blocked")))
            except (OSError, URLError) as exc:
                failed.append(str(exc))

    since = time.time_ns() // 1000
    driver = threading.Thread(target=drive)
    driver.start()
    try:
        time.sleep(3)
        gone = time.time_ns() // 1000
        if how == "delete":
            cluster.kubectl("-n", SYSTEM, "delete", "pod", old["metadata"]["name"], "--wait=false")
            new = collector_pod(not_uid=old["metadata"]["uid"])
        else:
            os.kill(host_pid(old, "collector"), signal.SIGKILL)
            new = collector_pod(restarts=old["status"]["containerStatuses"][0]["restartCount"] + 1)
        ready = time.time_ns() // 1000
        back = wait_for("the new collector registering the worker again",
                        lambda: logged_us(collector_log(new), registered(app["worker"]), gone), timeout=90,
                        seen=lambda: f"{app_log(app)}\n{collector_log(new)}")
        time.sleep(3)
    finally:
        stop.set()
        driver.join()
    assert not failed, failed
    spans = blocked_spans(app, len(answers), since)
    assert len(spans) == len(answers), (len(spans), len(answers))
    statuses = [s["tags"].get("gil.status", "ok") for s in spans]
    log = app_log(app)
    fell_back = logged_us(log, "tracing in-process until it is back", gone)
    seen = (f"{how} at {gone}, in-process at {fell_back}, Ready at {ready}, registered at {back}; spans not ok: "
            f"{[(s['startTime'], s['duration'], t) for s, t in zip(spans, statuses) if t != 'ok']}\n"
            f"{log}\n{collector_log(new)}")
    assert fell_back and set(statuses) <= {"ok", "collector_changed"}, seen
    # A span that straddles a switch (the app's to its own writer, its next registration, which
    # follows the collector's log line by a GIL hand-off): none where the switch fell between two
    # requests, which it often does (the registrar thread waits out the hold as the request does).
    changed = [s for s, status in zip(spans, statuses) if status == "collector_changed"]
    assert len(changed) <= 2 and all(any(s["startTime"] - SWITCH_US < at < s["startTime"] + s["duration"] + SWITCH_US
                   for at in (fell_back, back)) for s in changed), seen
    phases = {"before": lambda s: s["startTime"] + s["duration"] < gone,
              "in-process": lambda s: s["startTime"] > fell_back and s["startTime"] + s["duration"] < back,
              "after": lambda s: s["startTime"] > back + SWITCH_US}
    for phase, during in phases.items():
        these = [(s["tags"], truth) for s, truth in zip(spans, answers) if during(s) and "gil.status" not in s["tags"]]
        assert len(these) >= KNOWN_WAITS, (phase, len(these), statuses)
        check_known_waits(*map(list, zip(*these[:KNOWN_WAITS])), what=f"{phase}: {seen}")
    print(f"{how}: {len(answers)} requests, {len(spans)} spans, {len(changed)} collector_changed; "
          f"in-process {(back - fell_back) / 1e6:.1f} s, the new collector Ready {(ready - gone) / 1e6:.1f} s after")
