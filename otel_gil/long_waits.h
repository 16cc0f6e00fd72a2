/* long_waits.c: a span's long wait, blame and event in C for the span hooks (_fastspan.c). */
#ifndef OTEL_GIL_LONG_WAITS_H
#define OTEL_GIL_LONG_WAITS_H

#include "fastspan.h"

#define LONG_WAIT_KEYS 7 /* gil.top_blocker.*: native_id, id, name, hold_ms, function, file, line */

/* What a span with a long wait adds to its figures. */
struct long_waits {
	int n;                               /* of keys and values (new references): the span's attributes */
	PyObject *keys[LONG_WAIT_KEYS];
	PyObject *values[LONG_WAIT_KEYS];
	PyObject *event;                     /* its gil.wait event, made (not appended yet) */
	int close_handed;                    /* wait_spans.draw's closing of hand-ups to the span to do */
};

/* The long waits since the span started (end: the thread's counters now, start's
 * exceeded by long waits): 1 with *lw filled, 0 (nothing held, no error set) where the
 * Python hooks must do it. Runs Python code (the event's making): before any check that
 * needs the GIL kept. */
HIDDEN int long_waits_read(Start *start, PyObject *span, uint64_t now, const struct counters *end, struct long_waits *lw);
/* Append the event (span._add_event, as the SDK checks it) and close the hand-ups; after the attributes.
 * open: the span was seen not ended and its lock free with no Python code run since (their checks skipped). */
HIDDEN void long_waits_commit(struct long_waits *lw, PyObject *span, int open);
HIDDEN void long_waits_clear(struct long_waits *lw);

#endif
