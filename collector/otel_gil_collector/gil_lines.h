/* The BPF side's GIL_LINE (otel_gil/gil_location.h): the line of a code object's
 * instruction, decoded from its line table as PyCode_Addr2Line does (the in-process
 * writer calls PyCode_Addr2Line itself; tests/unit/test_line_tables.py holds this
 * decoder to it on every code object of the standard library, each format).
 *
 * The table's first GIL_LINES_MAX bytes are copied to a per-CPU buffer and read a byte
 * (or a pair) per step. Steps are written without branches (flags are 0 or 1 and
 * multiply the updates they guard, hidden from the compiler by GIL_OPAQUE so that it
 * cannot turn them back into comparisons, which BPF compiles to jumps), and the loop
 * looks whether the line was found once per GIL_LINES_CHUNK steps: every jump out of
 * the loop is a path the verifier follows through the rest of the program, and one a
 * step, over hundreds of steps, is more than it accepts. Each program decodes one
 * format, a constant here (gil.bpf.c has a cond_signal per format), so the compiler
 * keeps that format's steps only.
 *   GIL_LINES_LNOTAB    (3.9)  (address delta, signed line delta) pairs; an instruction's
 *                              line is the one before the pair whose range passes it
 *   GIL_LINES_PAIRS     (3.10) (address delta, line delta or -128: no line) pairs; the
 *                              delta applies to its own range
 *   GIL_LINES_LOCATIONS (3.11+, PEP 657) entries of a start byte (bit 7; code in bits 3-6;
 *                              code units - 1 in bits 0-2) and varint bytes: codes 13 and 14
 *                              begin with the line delta as a signed varint (6 bits a byte,
 *                              bit 6: more), 10-12 are deltas 0-2, 15 is "no line", the
 *                              others keep the line
 *
 * The includer defines GIL_READ (as for gil_location.h) and GIL_LINES_MAX (a power of 2): the most
 * bytes a decoding reads.
 */
#ifndef OTEL_GIL_LINES_H
#define OTEL_GIL_LINES_H

#include "gil_layout.h"

#define GIL_OPAQUE(x) ({ __s64 x_ = (x); asm volatile("" : "+r"(x_)); x_; })
#define GIL_LT(a, b) GIL_OPAQUE((__s64)(((__u64)(a) - (__u64)(b)) >> 63)) /* (a < b) for |a - b| < 2^62 */
#define GIL_BYTE(buf, i) ({ __u32 at_ = (__u32)(i); asm volatile("" : "+r"(at_)); (__s64)(buf)[at_ & (GIL_LINES_MAX - 1)]; })

#define GIL_LINES_CHUNK 32 /* steps between two looks at "found" (the only jump) */
#ifdef __clang__
#define GIL_UNROLL _Pragma("unroll") /* BPF: a chunk's steps are one straight path */
#else
#define GIL_UNROLL
#endif

/* The decoder's state; result is set once (done). */
struct gil_lines {
	__s64 n, size, addr, line, start, end;
	__s64 reading, value, shift, entry_len; /* locations: a line delta's varint being read */
	__s64 result, done;                     /* the line (0: none), or -1: past the n bytes read */
};

static __always_inline void gil_lines_found(struct gil_lines *t, __s64 hit, __s64 line)
{
	hit = GIL_OPAQUE(hit * (1 - t->done));
	t->result += hit * (line - t->result);
	t->done |= hit;
}

/* Pair i (3.9, 3.10). */
static __always_inline void gil_lines_pair(struct gil_lines *t, const __u8 *buf, __s64 i, int lnotab)
{
	__s64 valid = GIL_LT(2 * i + 1, t->n);
	__s64 step = GIL_BYTE(buf, 2 * i) * valid, b = GIL_BYTE(buf, 2 * i + 1), delta = ((b ^ 0x80) - 0x80) * valid;
	t->start = t->end;
	t->end += step;
	if (lnotab) { /* the line before this pair's delta, if the pair's range passes addr */
		gil_lines_found(t, valid * GIL_LT(t->addr, t->end), t->line);
		t->line += delta;
		/* past the pairs read: the last pair's line runs to the end of the code */
		gil_lines_found(t, 1 - valid, (1 - GIL_LT(t->n, t->size)) * (t->line + 1) - 1);
	} else { /* the delta is its own range's (-128: it has no line) */
		__s64 none = GIL_OPAQUE(1 - GIL_OPAQUE(((b ^ 0x80) + 255) >> 8));
		t->line += (1 - none) * delta;
		gil_lines_found(t, valid * (1 - GIL_LT(t->addr, t->start)) * GIL_LT(t->addr, t->end), (1 - none) * t->line);
		gil_lines_found(t, 1 - valid, -1);
	}
}

/* Byte i of a location table (3.11+). */
static __always_inline void gil_lines_byte(struct gil_lines *t, const __u8 *buf, __s64 i)
{
	__s64 valid = GIL_LT(i, t->n), b = GIL_BYTE(buf, i) * valid, code = (b >> 3) & 15, len = ((b & 7) + 1) * 2;
	__s64 st = GIL_OPAQUE(b >> 7), varint = GIL_OPAQUE((0x6000 >> code) & 1);
	__s64 at_once = st & (varint ^ 1), opens = st & varint;
	__s64 more = valid & (st ^ 1) & t->reading, closes = GIL_OPAQUE(more & ((b >> 6) ^ 1));
	/* an entry with its line delta in its start byte: its range ends here */
	t->line += at_once * (__s64)((0x0002100000000000ULL >> (code * 4)) & 15);
	t->end += at_once * len;
	gil_lines_found(t, at_once * GIL_LT(t->addr, t->end), (1 - GIL_OPAQUE((code + 1) >> 4)) * t->line); /* 15: no line */
	/* an entry whose line delta is a varint: its range ends with the varint */
	t->entry_len += opens * (len - t->entry_len);
	t->value &= opens - 1;
	t->shift &= opens - 1;
	t->value |= more * ((b & 63) << (t->shift & 31));
	t->shift += more * 6;
	__s64 negative = GIL_OPAQUE(t->value & 1);
	t->line += closes * (((t->value >> 1) ^ -negative) + negative);
	t->end += closes * t->entry_len;
	gil_lines_found(t, closes * GIL_LT(t->addr, t->end), t->line);
	t->reading = opens | (t->reading & (closes ^ 1) & (st ^ 1));
	gil_lines_found(t, 1 - valid, -1); /* past the bytes read */
}

/* The line of the instruction at byte offset addr in a line table of `format` (its first
 * n <= limit of size bytes in buf); 0 where it has none, -1 if it is past the n bytes read.
 * t is in map memory, not on the stack: the verifier then knows nothing of the values a
 * step leaves, where it would track ranges that grow each step and find no two states
 * alike to stop at. */
static __always_inline int gil_decode_line(struct gil_lines *t, const __u8 *buf, __u32 n, __u32 size, int format,
					   int first_line, long addr, __u32 limit)
{
	if (addr < 0)
		return first_line;
	t->n = n, t->size = size, t->addr = addr, t->line = first_line, t->result = -1;
	t->start = t->end = t->reading = t->value = t->shift = t->entry_len = t->done = 0;
	for (__s64 chunk = 0; chunk <= limit / GIL_LINES_CHUNK; chunk++) { /* one more: the end */
		GIL_UNROLL
		for (__s64 j = 0; j < GIL_LINES_CHUNK; j++) {
			__s64 i = chunk * GIL_LINES_CHUNK + j;
			if (format == GIL_LINES_LOCATIONS)
				gil_lines_byte(t, buf, i);
			else
				gil_lines_pair(t, buf, i, format == GIL_LINES_LNOTAB);
		}
		if (t->done)
			break;
	}
	return (int)t->result;
}

/* What a program decodes in: the table's first bytes, and the decoder's state. */
struct gil_lines_scratch {
	__u8 bytes[GIL_LINES_MAX];
	struct gil_lines t;
};

/* GIL_LINE for a program that decodes `format`: the table's first `limit` (<= GIL_LINES_MAX)
 * bytes copied to scratch, then decoded. */
static __always_inline int gil_line_of(const struct gil_py_layout *py, __u64 code, long addr, int format, __u32 limit,
				       struct gil_lines_scratch *scratch)
{
	__u64 table = 0, type = 0, size = 0;
	int first_line = 0;
	if (py->line_format != format || GIL_READ(&first_line, 4, code + py->code_firstlineno) ||
	    GIL_READ(&table, 8, code + py->code_linetable) || !table || GIL_READ(&type, 8, table + py->ob_type) ||
	    type != py->bytes_type || GIL_READ(&size, 8, table + py->bytes_size))
		return -1;
	__u32 n = size < limit ? (__u32)size : limit;
	if (n > GIL_LINES_MAX || (n && GIL_READ(scratch->bytes, n, table + py->bytes_data)))
		return -1;
	return gil_decode_line(&scratch->t, scratch->bytes, n, size > 0x7fffffffULL ? 0x7fffffff : (__u32)size, format,
			       first_line, addr, limit);
}

#endif
