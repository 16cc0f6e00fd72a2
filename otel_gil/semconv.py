"""otel-gil's vocabulary: every ``gil.status`` value and every key it sets, with its meaning.

- :data:`STATUSES`: ``gil.status`` value -> meaning. A span carries one only where it has no
  figures (README.md's table of them is this one: a unit test compares the two).
- :data:`ATTRIBUTES`: span and event attribute keys and metric attribute keys -> meaning.
- :data:`EVENTS`: the event (and child span) name -> meaning.
- :data:`ALWAYS`, :data:`WHEN_NONZERO`, :data:`EVERY_ONLY`: which figures a span carries (the "On a span"
  column of README.md's attribute table says the same: a unit test compares the two).
- :data:`C_HOOK_KEYS`: the keys the C span hooks (``otel_gil/_fastspan.c``) set; they read them from here.

No dependency: the collector reads the statuses it answers with through ``otel_gil.protocol``.
"""

from __future__ import annotations

STATUSES: dict[str, str] = {}
ATTRIBUTES: dict[str, str] = {}
EVENTS: dict[str, str] = {}


def _status(value: str, meaning: str) -> str:
    STATUSES[value] = meaning
    return value


def _key(key: str, meaning: str) -> str:
    ATTRIBUTES[key] = meaning
    return key


# A registration's status while figures flow (the backends' State.status): never on a span.
REGISTERED = "ok"

# ``gil.status``: the app's side.
PENDING = _status("pending", "not registered yet: a process's first spans, a forked child's until its first span "
                             "registered it")
NO_COLLECTOR = _status("no_collector", "no collector answers on the socket, or it went away (and the in-process "
                                       "backend could not stand in)")
GIL_NOT_LOCATED = _status("gil_not_located", "registered, but the probes saw none of the process's GIL hand-offs")
COLLECTOR_ERROR = _status("collector_error", "the collector refused with a reason this otel_gil does not know (a newer "
                                             "collector?): the app's log has its text")
# ``gil.status``: the collector's answers (``otel_gil.protocol.ERRORS``); the in-process backend says the first three too.
UNSUPPORTED_INTERPRETER = _status("unsupported_interpreter", "this interpreter cannot be traced: no probe fits it, or "
                                                             "the C part was not built (no compiler at install)")
UNSUPPORTED_VERSION = _status("unsupported_version", "the collector and otel_gil speak different protocol versions or "
                                                     "ring layouts: upgrade one of them")
GIL_DISABLED = _status("gil_disabled", "a free-threaded build running without a GIL: there is none to wait for")
BAD_REQUEST = _status("bad_request", "the collector could not read this process's registration")
ATTACH_FAILED = _status("attach_failed", "the collector could not attach its probes to the process")
TOO_MANY_PROCESSES = _status("too_many_processes", "the collector traces as many processes as it may")
PROCESS_GONE = _status("process_gone", "the process exited, or its pid changed, while the collector registered it")
INTERNAL = _status("internal_error", "the collector failed, or the ring it sent could not be mapped: the logs say why")
# ``gil.status``: one span's figures.
GIL_TURNED_ON = _status("gil_turned_on", "a free-threaded build's GIL was turned on while the span ran (an import: its "
                                         "`gil.enabled` event names the module): spans that start after it have figures")
CROSS_THREAD = _status("cross_thread", "ended on another thread than it started on")
COLLECTOR_CHANGED = _status("collector_changed", "the process registered anew while the span ran (the collector "
                                                 "restarted, the in-process backend stood in or stepped back)")
SHARED_THREAD = _status("shared_thread", "its thread ran other requests' code in turns no hook sees (an event loop "
                                         "or C extension that enters contexts unseen): no hold figure, the thread's "
                                         "waits only")
UNTRACKED = _status("untracked", "otel-gil was uninstrumented while its code shared a thread or ran on others")
END_PASSED = _status("end_time_passed", "ended with an explicit `end_time` in the past, and the thread took the GIL "
                                        "again after it: its figures up to then are no longer in its slot")
INCONSISTENT = _status("inconsistent", "the figures read broke an invariant: dropped, never exported, counted in "
                                       "`gil.spans.dropped`")

# Span attributes.
THREAD_ID = _key("thread.id", "managed id of the span's thread (`threading.get_ident()`), as its log records carry it")
THREAD_NAME = _key("thread.name", "`threading` name of the span's thread; on metrics, of the threads counted")
GIL_STATUS = _key("gil.status", "why a span has no figures, or (shared_thread) no hold: one of STATUSES; absent "
                                "where it has them all")
GIL_WAIT_MS = _key("gil.wait_ms", "time waited for the GIL: on a span, by its thread (and its own code elsewhere) while "
                                  "it ran; on a gil.wait event, that wait")
GIL_HOLD_MS = _key("gil.hold_ms", "time the span's thread (on a shared thread: its own code) held the GIL")
GIL_OTHERS_HOLD_MS = _key("gil.others_hold_ms", "on a shared thread: held for other contexts' code while the span ran")
GIL_WAIT_RATIO = _key("gil.wait_ratio", "gil.wait_ms / the span's duration")
GIL_HOLD_RATIO = _key("gil.hold_ratio", "gil.hold_ms / the span's duration")
GIL_ACQUISITIONS = _key("gil.acquisitions", "GIL acquisitions by the span's thread (on a shared thread: its own code)")
GIL_CONVOY_WAITS = _key("gil.convoy_waits", "waits at least one switch interval long (forced switches included)")
GIL_LONG_WAITS_DROPPED = _key("gil.long_waits_dropped", "long waits that fell out of the thread's ring before the span "
                                                        "ended")
GIL_WAIT_SPANS_DROPPED = _key("gil.wait_spans_dropped", "long waits its child spans handed up to it past the last 16 it "
                                                        "keeps: drawn as no gil.wait span (still events of those children)")
TOP_BLOCKER = "gil.top_blocker"  # prefix of code_attributes()
TOP_BLOCKER_THREAD = f"{TOP_BLOCKER}.thread"  # prefix of thread_attributes()
_key(f"{TOP_BLOCKER_THREAD}.id", "thread.id of the thread that held the GIL longest while the span's thread waited")
_key(f"{TOP_BLOCKER_THREAD}.name", "the top blocker's thread name")
_key(f"{TOP_BLOCKER_THREAD}.native_id", "the top blocker's kernel thread id")
TOP_BLOCKER_HOLD_MS = _key(f"{TOP_BLOCKER}.hold_ms", "how long the top blocker held the GIL during the span's long waits")
_key(f"{TOP_BLOCKER}.code.function.name", "the function the top blocker was in when it released the GIL after the holds that "
                                          "blocked the span most")
_key(f"{TOP_BLOCKER}.code.file.path", "the top blocker's file")
_key(f"{TOP_BLOCKER}.code.line.number", "the top blocker's line")

# The event of a long wait, and its attributes (a gil.wait child span carries them too).
GIL_WAIT = "gil.wait"
EVENTS[GIL_WAIT] = "one wait for the GIL of at least OTEL_GIL_LONG_WAIT_MS, blaming who held it (an event, a child span)"
BLOCKER = "gil.blocker"  # prefix of code_attributes()
BLOCKER_THREAD = f"{BLOCKER}.thread"  # prefix of thread_attributes()
_key(f"{BLOCKER_THREAD}.id", "thread.id of the thread that held the GIL longest during the wait (absent if it is not "
                             "a live Python thread)")
_key(f"{BLOCKER_THREAD}.name", "the blocker's thread name")
_key(f"{BLOCKER_THREAD}.native_id", "the blocker's kernel thread id (the last releaser if no hold was logged)")
BLOCKER_HOLD_MS = _key(f"{BLOCKER}.hold_ms", "how long the blocker held the GIL during the wait")
BLOCKER_SPAN_NAME = _key(f"{BLOCKER}.span.name", "the span whose code the blocker ran then, where otel-gil can tell")
BLOCKER_SPAN_ID = _key(f"{BLOCKER}.span_id", "the blocker's span's id")
_key(f"{BLOCKER}.code.function.name", "the function the longest holder was in when it released the GIL")
_key(f"{BLOCKER}.code.file.path", "the blocker's file")
_key(f"{BLOCKER}.code.line.number", "the blocker's line")
BLOCKER_CODE_STACKTRACE = _key(f"{BLOCKER}.code.stacktrace", "the blocker's innermost 1-4 frames, innermost first, one a line")
BLOCKERS_THREAD_NATIVE_ID = _key("gil.blockers.thread.native_id", "the four longest holders' kernel thread ids, most "
                                                                  "held first")
BLOCKERS_THREAD_NAME = _key("gil.blockers.thread.name", "the four longest holders' thread names")
BLOCKERS_HOLD_MS = _key("gil.blockers.hold_ms", "how long each of the four held the GIL during the wait")
BLOCKERS_OTHERS_MS = _key("gil.blockers.others_ms", "held by further threads")
BLOCKERS_UNRECORDED_MS = _key("gil.blockers.unrecorded_ms", "held in holds too short to be logged one by one")
GIL_HANDOFF_MS = _key("gil.handoff_ms", "nobody held the GIL: the waiter was being woken")
GIL_WAIT_FORCED_SWITCH = _key("gil.wait.forced_switch", "true: the wait began when the thread was made to drop the GIL")

# The event of a span in flight when an import turned a free-threaded build's GIL on (and the gauge's name).
GIL_ENABLED = "gil.enabled"
EVENTS[GIL_ENABLED] = "an import turned a free-threaded build's GIL on, at the event's time, while the span ran"
GIL_ENABLED_BY = _key("gil.enabled_by", "the module whose import turned a free-threaded build's GIL on (on the "
                                        "gil.enabled event and gauge)")

# Parked time (a free-threaded build running without its GIL: README, "Free-threaded builds", "Parked time"),
# by what the span's thread parked on (otel_gil/parks.py; gil_layout.h's GIL_PARK_* in this order).
PARKED = "cpython.parked"
PARK_KINDS = ("stop_the_world", "critical_section", "app_lock", "internal", "other")
PARKED_MS = tuple(_key(f"{PARKED}.{kind}_ms", meaning) for kind, meaning in zip(PARK_KINDS, (
    "parked while the interpreter stopped the world (the GC of a free-threaded build, ...): suspended, or "
    "the requester waiting for the others to stop",
    "parked on an object's lock: another thread held a critical section on it (a list, dict, set shared "
    "between threads)",
    "parked on the app's own lock: a threading.Lock (and the locks built on it), a threading.RLock",
    "parked on a lock inside the interpreter's state (imports, allocator, type cache, ...)",
    "parked on anything else: a Thread.join, an event, a once-only initialisation")))
PARKED_TOTAL_MS = _key(f"{PARKED}_ms", "parked in all, the sum of the cpython.parked.*_ms")
PARKS = _key("cpython.parks", "parks made by the span's thread while it ran")
PARKED_TOP_TYPE = _key(f"{PARKED}.critical_section.top_type", "the type of the object whose lock the span's "
                                                                "recorded parks waited on longest")
PARKED_TOP_TYPE_MS = _key(f"{PARKED}.critical_section.top_type_ms", "how long they waited on that type's objects")
PARKS_DROPPED = _key("cpython.parks.long_dropped", "long parks that fell out of the thread's ring before the span ended")
PARK = "cpython.park"
EVENTS[PARK] = "one park of at least the switch interval, naming what it parked on (an event, a child span)"
PARK_KIND = _key(f"{PARK}.kind", "what a park waited on: one of " + ", ".join(PARK_KINDS))
PARK_TYPE = _key(f"{PARK}.object.type", "critical_section: the type of the object parked on")
PARK_MS = _key(f"{PARK}.ms", "the park's length")
PARKED_TIME = "cpython.parked.time"  # the metric (s), by PARK_KIND

# Metric attributes (and one read from server spans).
HTTP_ROUTE = _key("http.route", "a server span's route: the gil.wait_ratio histogram's series")
LE = _key("le", "a gil.wait_ratio.bucket's upper bound (Prometheus' classic histogram)")
REASON = _key("reason", "why: a gil.location.misses location not read, a gil.spans.dropped span's figures")

# Which figures a span with them carries: writing an attribute costs the span more than reading the GIL's
# counters, so a calm span writes the fewest. OTEL_GIL_ALL_ATTRIBUTES=1 puts all of them on every span.
# The blocker's attributes come only with a long wait, gil.status only where a span lacks figures; the
# metrics count every span whatever it carries.
ALWAYS = (THREAD_NAME, THREAD_ID, GIL_WAIT_MS, GIL_HOLD_MS, GIL_WAIT_RATIO)
"""On every span with figures: what users filter and alert on, and whose thread it ran on."""
WHEN_NONZERO = (GIL_ACQUISITIONS, GIL_CONVOY_WAITS, GIL_OTHERS_HOLD_MS, GIL_LONG_WAITS_DROPPED, GIL_WAIT_SPANS_DROPPED)
"""Counters that say nothing at 0: only where they are not."""
EVERY_ONLY = (GIL_HOLD_RATIO,)
"""Derived from the others (gil.hold_ms / the span's duration): only with OTEL_GIL_ALL_ATTRIBUTES."""

# The keys the C span hooks set (otel_gil/_fastspan.c reads each from here by its name).
C_HOOK_KEYS = (THREAD_NAME, THREAD_ID, GIL_WAIT_MS, GIL_HOLD_MS, GIL_WAIT_RATIO, GIL_HOLD_RATIO, GIL_ACQUISITIONS,
               GIL_CONVOY_WAITS, GIL_OTHERS_HOLD_MS, HTTP_ROUTE)
