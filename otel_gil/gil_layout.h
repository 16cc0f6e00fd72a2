/* The C half of the shared-memory layout (the Python half is otel_gil/ring.py).
 *
 * One BPF array per registered process, created BPF_F_MMAPABLE: entry 0 holds
 * struct gil_header, entries 1..nslots hold one struct gil_slot per thread,
 * found by tid with open addressing. Every entry is sizeof(struct gil_slot)
 * bytes. All times are CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns). Thread
 * ids are as the process sees them, in its own pid namespace (a container's).
 * tests/unit/test_layout.py compiles this file and checks both halves agree.
 *
 * After the slots, entries nslots+1 .. nslots+GIL_HOLD_PAGES hold the process's
 * hold log (struct gil_hold_page): the recent GIL holds of every thread, for
 * blame by time held (which threads held the GIL during a long wait). Then
 * GIL_LOC_LEN entries hold one struct gil_location each: where the holder's
 * Python code was when it released the GIL, for the newest logged holds.
 *
 * Two writers fill this layout: the collector (collector/otel_gil_collector/gil.bpf.c, eBPF
 * uprobes) and the in-process backend (otel_gil/_inprocess.c, GOT hooks). Both
 * hook the same libc calls and run the same event logic, gil_writer.h (beside this file),
 * which says what each event writes; the comments on the fields say when.
 */
#ifndef OTEL_GIL_LAYOUT_H
#define OTEL_GIL_LAYOUT_H

#define GIL_MAGIC 0x004c49474c45544fULL /* "OTELGIL\0", little-endian */
#define GIL_LAYOUT_VERSION 7
#define GIL_HIST_BUCKETS 32 /* bucket i counts waits in [2^i, 2^(i+1)) ns */
#define GIL_RING_LEN 16     /* long waits, and long holds, kept per thread */
#define GIL_PROBE_LEN 16    /* open-addressing window searched for a tid */
#define GIL_HOLD_LOG_LEN 4096  /* holds kept in the process's hold log (a power of 2) */
#define GIL_HOLDS_PER_PAGE 32  /* holds per array entry (a power of 2) */
#define GIL_HOLD_PAGES (GIL_HOLD_LOG_LEN / GIL_HOLDS_PER_PAGE)
#define GIL_HOLD_RECORD_NS 100000ULL /* header.hold_record_ns both writers set: holds logged one by one */
#define GIL_LOC_LEN 1024    /* locations kept, of the newest logged holds (a power of 2) */
#define GIL_LOC_FRAMES 4    /* innermost Python frames kept per location */
#define GIL_LOC_NAME 64     /* bytes kept of a function's name: its start */
#define GIL_LOC_FILE 144    /* bytes kept of a file's path: its end */

/* Parks (free-threaded builds with the GIL off: the threads' waits in CPython's parking lot),
 * by what the address parked on belongs to (gil_park_kind in the in-process writer). */
#define GIL_PARK_STW 0       /* the thread's own tstate->state, or a stop-the-world's stop_event */
#define GIL_PARK_OBJECT 1    /* an object's ob_mutex: a critical section on it */
#define GIL_PARK_APP_LOCK 2  /* a threading.Lock (or a PyThread lock: threading.RLock on 3.13) */
#define GIL_PARK_INTERNAL 3  /* inside _PyRuntime or the main PyInterpreterState */
#define GIL_PARK_OTHER 4     /* anything else: a join, an event, a once flag */
#define GIL_PARK_KINDS 5
#define GIL_PARK_RING_LEN 8  /* long parks kept per thread (a power of 2) */
#define GIL_PARK_TYPE 24     /* bytes kept of an object's type name (tp_name's start, NUL-padded) */

#define GIL_SLOT_IN_TAKE_GIL 1 /* slot.flags: inside take_gil, cond addresses not yet learned */
#define GIL_SLOT_FORCED 2      /* slot.flags: the open wait began at a requested release (FORCED) */
#define GIL_SLOT_UNCHECKED 4   /* slot.flags: ... and STALE_CHECK has not run on it yet (readers skip it) */
#define GIL_WAIT_FORCED 1      /* gil_long_wait.flags: this wait began at a forced switch */

/* gil_location.why: why a location has no frame, or fewer frames or lines than it
 * could have (header.location_misses counts each, by its index here). */
#define GIL_LOC_NO_LAYOUT 0  /* no struct offsets for this interpreter (header.py.minor == 0) */
#define GIL_LOC_HOLDER 1     /* gil->last_holder is not the state the releasing thread acquired for */
#define GIL_LOC_NO_FRAME 2   /* the thread runs no Python code (exiting, or C only) */
#define GIL_LOC_UNREADABLE 3 /* a read of the interpreter's memory failed */
#define GIL_LOC_NOT_CODE 4   /* a frame's code is not a code object */
#define GIL_LOC_NOT_STR 5    /* a name or path is not a compact str */
#define GIL_LOC_NO_LINE 6    /* a line is past the part of the line table a writer decodes */
#define GIL_LOC_WHYS 8

/* header.py.frame_kind: how a thread's frames are kept. */
#define GIL_FRAME_OBJECT 1 /* PyFrameObject chain, int f_lasti (3.9, 3.10) */
#define GIL_FRAME_INTERP 2 /* _PyInterpreterFrame chain, an instruction pointer (3.11+) */
/* header.py.line_format: how a code object maps instructions to lines. */
#define GIL_LINES_LNOTAB 1    /* co_lnotab: (byte delta, line delta) pairs (3.9) */
#define GIL_LINES_PAIRS 2     /* co_linetable: (byte delta, line delta or -128) pairs (3.10) */
#define GIL_LINES_LOCATIONS 3 /* co_linetable: the location table of PEP 657 (3.11+) */

struct gil_long_wait {
	__u64 start_ns;
	__u64 end_ns;
	__u32 blocker_tid; /* thread that released the GIL last before this acquisition */
	__u32 flags;       /* GIL_WAIT_*: GIL_SLOT_FORCED of the slot when the wait closed */
	__u64 held_ns;     /* time any thread held the GIL during the wait: header.held_total_ns at
	                    * ACQUIRE minus slot.wait_mark_ns, clamped to [0, end - start]; the rest
	                    * (end - start - held_ns) is hand-off: the GIL was free, the waiter not yet
	                    * running */
};

/* One hold of the hold log, written at RELEASE by the releasing thread when the
 * hold lasted at least header.hold_record_ns. */
struct gil_hold {
	__u64 start_ns; /* the holder's ACQUIRE (slot.acquired_ns) */
	__u64 end_ns;   /* its RELEASE */
	__u32 tid;      /* the holder */
	__u32 reserved; /* 0 */
};

/* Hold h (0, 1, 2, ... as counted by header.holds_written) lives in entry
 * nslots + 1 + (h % GIL_HOLD_LOG_LEN) / GIL_HOLDS_PER_PAGE, at index
 * h % GIL_HOLDS_PER_PAGE of that entry. */
struct gil_hold_page {
	struct gil_hold holds[GIL_HOLDS_PER_PAGE];
};

/* Where a thread's Python code was: one frame, strings as CPython keeps them (PEP 393). */
struct gil_frame {
	__u32 line;      /* the line being run; 0 = unknown (gil_location.why says why) */
	__u8 name_kind;  /* bytes per character of name[]: 1 (latin-1), 2 (UCS-2), 4 (UCS-4) */
	__u8 file_kind;  /* ... of file[] */
	__u16 reserved;  /* 0 */
	__u32 name_len;  /* characters of the function's whole name (co_qualname; co_name before
	                  * 3.11); name[] holds its first min(name_len * name_kind, GIL_LOC_NAME) bytes */
	__u32 file_len;  /* characters of the whole path (co_filename); file[] holds its last
	                  * min(file_len * file_kind, GIL_LOC_FILE) bytes */
	char name[GIL_LOC_NAME];
	char file[GIL_LOC_FILE];
};

/* The location of hold h of the hold log: entry nslots + 1 + GIL_HOLD_PAGES + h % GIL_LOC_LEN.
 * Written at that hold's RELEASE by the releasing thread (under gil->mutex): seq = 2h + 1,
 * the rest, then seq = 2h + 2 with release ordering; a reader trusts a copy made between
 * two reads of seq == 2h + 2. */
struct gil_location {
	__u64 seq;
	__u32 nframes; /* frames[0] is the innermost Python frame */
	__u32 why;     /* 1 << GIL_LOC_*: what kept frames or lines out (0: nothing; up to
	                * GIL_LOC_FRAMES frames of a deeper stack are kept without a why) */
	struct gil_frame frames[GIL_LOC_FRAMES];
};

/* Where the interpreter keeps what a location is read from, for this process's CPython
 * (otel_gil/pystructs.py has the table; whoever creates the ring fills this in). Offsets
 * are from the start of the struct named; -1: the field does not exist in this version. */
struct gil_py_layout {
	__u16 minor;          /* CPython 3.minor; 0: no locations (why: GIL_LOC_NO_LAYOUT) */
	__u8 frame_kind;      /* GIL_FRAME_* */
	__u8 line_format;     /* GIL_LINES_* */
	__u8 lasti_scale;     /* GIL_FRAME_OBJECT: bytes of code per f_lasti unit (1 on 3.9, 2 on 3.10) */
	__u8 code_tag_bits;   /* low bits of the frame's code pointer that are tags (_PyStackRef, 3.14+) */
	__u8 skip_owner;      /* GIL_FRAME_INTERP: frames whose owner is at least this are the
	                       * interpreter's own (C stack, entry frames), not Python code; 0: none */
	__u8 reserved;
	__s32 gil_last_holder;   /* &gil->last_holder - &gil->cond: the thread state take_gil acquired for,
	                          * and drop_gil releases for */
	__s32 tstate_frame;      /* PyThreadState: frame (3.9, 3.10), cframe (3.11, 3.12), current_frame (3.13+) */
	__s32 cframe_frame;      /* _PyCFrame.current_frame where tstate_frame is cframe; else -1 */
	__s32 frame_previous;    /* f_back / previous */
	__s32 frame_code;        /* f_code / f_executable */
	__s32 frame_instr;       /* f_lasti (int) / prev_instr (3.11, 3.12) / instr_ptr (3.13+) */
	__s32 frame_owner;       /* owner (char; 3.11+) */
	__s32 code_name;         /* co_qualname (3.11+), co_name before */
	__s32 code_filename;
	__s32 code_firstlineno;  /* int */
	__s32 code_linetable;    /* co_linetable (3.10+), co_lnotab (3.9): a bytes object */
	__s32 code_code;         /* co_code_adaptive: where the instructions start (3.11+) */
	__s32 code_firsttraceable; /* _co_firsttraceable (int, 3.11+) */
	__s32 bytes_size;        /* PyVarObject.ob_size */
	__s32 bytes_data;        /* PyBytesObject.ob_sval */
	__s32 str_length;        /* PyASCIIObject.length */
	__s32 str_state;         /* PyASCIIObject.state: kind (bits 2-4), compact (5), ascii (6) */
	__s32 str_ascii_data;    /* sizeof(PyASCIIObject): a compact ASCII string's characters */
	__s32 str_compact_data;  /* sizeof(PyCompactUnicodeObject): other compact strings' */
	__s32 ob_type;           /* PyObject.ob_type: 8, 24 on a free-threaded build (its header has more) */
	__u64 code_type;         /* &PyCode_Type, &PyUnicode_Type, &PyBytes_Type in this process */
	__u64 str_type;
	__u64 bytes_type;
};

struct gil_long_hold {
	__u64 start_ns;
	__u64 end_ns;
};

/* A park of at least header.long_wait_ns, written when it ends. */
struct gil_long_park {
	__u64 start_ns;
	__u64 end_ns;
	__u64 addr;               /* the address parked on */
	__u32 kind;               /* GIL_PARK_* */
	__u32 reserved;           /* 0 */
	char type[GIL_PARK_TYPE]; /* GIL_PARK_OBJECT: the object's type name; else empty */
};

struct gil_slot {
	__u64 seq;           /* odd while the BPF side writes this slot */
	__u32 tid;           /* owner thread (kernel tid); 0 = free */
	__u32 flags;         /* GIL_SLOT_* */
	__u64 wait_ns;       /* closed waits */
	__u64 hold_ns;       /* closed holds */
	__u64 acquisitions;
	__u64 convoy_waits;  /* waits >= header.convoy_ns */
	__u64 long_waits;    /* waits >= header.long_wait_ns ever; ring[long_waits % GIL_RING_LEN] is next */
	__u64 wait_start_ns; /* open wait: started at, 0 when not waiting */
	__u64 acquired_ns;   /* open hold: acquired at, 0 when not holding */
	__u32 hist[GIL_HIST_BUCKETS];
	struct gil_long_wait ring[GIL_RING_LEN];
	__u64 long_holds;    /* holds >= header.long_hold_ns ever; hold_ring[long_holds % GIL_RING_LEN] is next */
	struct gil_long_hold hold_ring[GIL_RING_LEN];
	/* Layout 4: blame and forced switches (what writes them: the top of this file). */
	__u64 wait_mark_ns;     /* process-wide held time (header.held_total_ns + the open hold's part)
	                         * when the open wait started: its held_ns is the difference at ACQUIRE */
	__u64 wait_acq_mark;    /* WAIT: header.acquisitions_total at this thread's latest WAIT */
	__u64 forced_waits;     /* waits that began at a requested release and stood (ACQUIRE) */
	__u64 forced_acq_mark;  /* RELEASE that opened a forced wait: header.acquisitions_total then */
	/* Layout 6 */
	__u64 tstate;           /* ACQUIRE: gil->last_holder, the thread state take_gil acquired the GIL
	                         * for (0 without header.py): a location is read from it only */
	/* Layout 7: parks, while a free-threaded build runs without its GIL (gil_writer.h: PARK, UNPARK). */
	__u64 parked_ns[GIL_PARK_KINDS]; /* closed parks, by GIL_PARK_* */
	__u64 parks;                     /* parks closed */
	__u64 park_start_ns;             /* open park: started at, 0 when not parked */
	__u64 park_addr;                 /* the open park's address */
	__u32 park_kind;                 /* the open park's GIL_PARK_* */
	__u32 park_reserved;             /* 0 */
	char park_type[GIL_PARK_TYPE];   /* the open park's type name (GIL_PARK_OBJECT) */
	__u64 long_parks;                /* parks >= header.long_wait_ns ever; park_ring[long_parks % GIL_PARK_RING_LEN] is next */
	struct gil_long_park park_ring[GIL_PARK_RING_LEN];
};

struct gil_header {
	__u64 magic;
	__u32 layout_version;
	__u32 slot_size;     /* bytes per entry, header entry included */
	__u32 nslots;        /* thread slots after the header entry */
	__u32 clock_id;      /* CLOCK_MONOTONIC */
	__u32 pid;           /* registered process, as the collector sees it */
	__u32 cond_stride;   /* &gil->switch_cond - &gil->cond for this libc */
	__u64 long_wait_ns;
	__u64 convoy_ns;
	__u64 pidns_dev;     /* the process's pid namespace: tids are read in it */
	__u64 pidns_ino;
	__u64 gil_cond;      /* learned address of gil->cond, 0 until learned */
	__u64 switch_cond;   /* learned address of gil->switch_cond */
	__u32 last_release_tid; /* RELEASE: the releasing thread (gil->mutex) */
	__u32 holder_tid;       /* ACQUIRE: the acquiring thread; RELEASE: 0 (gil->mutex) */
	__u64 slot_overflows; /* events dropped: no free slot in the probe window */
	__u64 exited_threads;  /* totals carried over from threads that exited */
	__u64 exited_wait_ns;
	__u64 exited_hold_ns;
	__u64 exited_acquisitions;
	__u64 exited_convoy_waits;
	__u64 long_hold_ns;
	/* Layout 4: process-wide, written under gil->mutex (see the top). */
	__u64 last_acquired_ns;   /* ACQUIRE: now (the holder's since, while holder_tid != 0) */
	__u64 acquisitions_total; /* ACQUIRE: += 1 */
	__u64 held_total_ns;      /* RELEASE: += the hold it closed (if its ACQUIRE was seen) */
	__u64 drop_request;       /* WAIT: 1 when take_gil asks the holder to drop the GIL; ACQUIRE: 0 */
	__u64 holds_written;    /* holds ever written to the hold log. RELEASE of a hold >= hold_record_ns:
	                         * write the record at holds_written % GIL_HOLD_LOG_LEN first, then store
	                         * holds_written + 1 with release ordering (a reader that read
	                         * holds_written = n before copying records and n2 after trusts
	                         * records n2 - GIL_HOLD_LOG_LEN + 1 .. n - 1: the writer may be
	                         * overwriting record n2 - GIL_HOLD_LOG_LEN) */
	__u64 hold_record_ns;   /* set at creation: shorter holds only add to held_total_ns */
	/* Layout 5: a thread's exit adds its figures to exited_* between exits_started += 1
	 * and exited_threads += 1 (a reader trusts exited_* read between equal counts). */
	__u64 exits_started;
	/* Layout 6: which code held the GIL (struct gil_location, after the hold log). */
	struct gil_py_layout py;
	__u64 locations_written;                /* RELEASE of a logged hold: += 1 (gil->mutex) */
	__u64 location_misses[GIL_LOC_WHYS];    /* locations with each GIL_LOC_* in their why */
	/* Layout 7 */
	__u64 exited_parked_ns[GIL_PARK_KINDS]; /* slot.parked_ns of threads that exited (EXIT) */
};

#endif
