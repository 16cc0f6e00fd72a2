/* Where a thread's Python code is when it releases the GIL (a logged hold's
 * struct gil_location): the one definition both writers compile, the collector's
 * BPF program (probe reads) and the in-process hooks (plain loads).
 *
 * The releasing thread is inside drop_gil, in pthread_cond_signal(&gil->cond): it
 * runs no bytecode, so its frames, their code objects and those objects' strings
 * stand still while they are read. drop_gil stored the thread state it releases
 * for in gil->last_holder just before (gil_py_layout.gil_last_holder: where that
 * is from &gil->cond); the state is trusted only if it is the one take_gil stored
 * there when this thread acquired the GIL (its slot's tstate, gil_acquired_for).
 * From it, the innermost GIL_LOC_FRAMES Python frames (the interpreter's own
 * frames skipped) are copied into the record: each function's name and file as
 * CPython stores them (PEP 393 bytes and kind: no decoding here), and the line
 * of the frame's current instruction (GIL_LINE: PyCode_Addr2Line in-process, the
 * collector's own decoder of the line table in BPF). Everything that depends on
 * the CPython version comes from header.py (otel_gil/pystructs.py).
 * Every object is type-checked before it is read as one: a location is left
 * short, never wrong, and why is set in its why bits.
 *
 * The includer defines, before including this file (besides gil_writer.h's):
 *   GIL_INLINE                 how these functions are declared
 *   GIL_READ(dst, n, src)      copy n bytes (n <= the destination's size) of the process's
 *                              memory at address src (a __u64) to dst; 0, or nonzero on failure
 *   GIL_PUBLISH(p, v)          a release store of v to the __u64 at p (v is one more than *p)
 *   GIL_LINE(py, code, addr, depth, where)  the line of the instruction at byte offset addr of
 *                              code object code (0: it has none), or -1 if it cannot be told;
 *                              depth: the frame's, 0 for the innermost
 *   GIL_WHERE                  the type of `where`: the includer's own argument, passed from
 *                              the writer's RELEASE down to GIL_LINE
 */
#ifndef OTEL_GIL_LOCATION_H
#define OTEL_GIL_LOCATION_H

#include "gil_layout.h"

#define GIL_FRAMES_WALKED 16 /* frames looked at per location, the interpreter's own included */
#define GIL_FRAME_OWNED_BY_GENERATOR 1 /* _PyInterpreterFrame.owner of a generator's frame (3.11+) */

GIL_INLINE __u64 gil_read_u64(__u64 address, int *failed)
{
	__u64 value = 0;
	if (GIL_READ(&value, sizeof(value), address))
		*failed = 1;
	return value;
}

GIL_INLINE __u32 gil_read_u32(__u64 address, int *failed)
{
	__u32 value = 0;
	if (GIL_READ(&value, sizeof(value), address))
		*failed = 1;
	return value;
}

/* Copy str object obj's characters into dst (cap bytes: its start, or its end where
 * keep_end); their kind and length. GIL_LOC_* if it is not a compact str, else -1. */
GIL_INLINE int gil_copy_str(const struct gil_py_layout *py, __u64 obj, char *dst, __u32 cap, int keep_end,
			    __u8 *kind_out, __u32 *len_out)
{
	int failed = 0;
	if (!obj || gil_read_u64(obj + py->ob_type, &failed) != py->str_type)
		return failed ? GIL_LOC_UNREADABLE : GIL_LOC_NOT_STR;
	__u32 state = gil_read_u32(obj + py->str_state, &failed);
	__u64 length = gil_read_u64(obj + py->str_length, &failed);
	__u32 kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
	if (failed)
		return GIL_LOC_UNREADABLE;
	if (!compact || (kind != 1 && kind != 2 && kind != 4) || length > (1U << 20))
		return GIL_LOC_NOT_STR;
	__u64 data = obj + (ascii ? py->str_ascii_data : py->str_compact_data);
	__u64 bytes = length * kind;
	__u32 n = bytes < cap ? (__u32)bytes : cap;
	if (n && GIL_READ(dst, n, keep_end ? data + bytes - n : data))
		return GIL_LOC_UNREADABLE;
	*kind_out = (__u8)kind;
	*len_out = (__u32)length;
	return -1;
}

/* One frame's record: names, file, line. GIL_LOC_* of what is missing, or -1. */
GIL_INLINE int gil_read_frame(const struct gil_py_layout *py, __u64 code, long addr, __u32 depth, struct gil_frame *f,
			      GIL_WHERE where)
{
	int failed = 0, why;
	why = gil_copy_str(py, gil_read_u64(code + py->code_name, &failed), f->name, GIL_LOC_NAME, 0, &f->name_kind,
			   &f->name_len);
	if (why < 0)
		why = gil_copy_str(py, gil_read_u64(code + py->code_filename, &failed), f->file, GIL_LOC_FILE, 1,
				   &f->file_kind, &f->file_len);
	if (why >= 0)
		return why;
	int line = GIL_LINE(py, code, addr, depth, where);
	if (line < 0)
		return GIL_LOC_NO_LINE;
	f->line = (__u32)line;
	return -1;
}

/* ACQUIRE: the thread state take_gil acquired the GIL for (it just stored it in gil->last_holder). */
GIL_INLINE __u64 gil_acquired_for(struct gil_header *h)
{
	int failed = 0;
	__u64 tstate = h->py.minor ? gil_read_u64(h->gil_cond + h->py.gil_last_holder, &failed) : 0;
	return failed ? 0 : tstate;
}

/* Fill loc, hold `hold`'s location, from the frames of the releasing thread, which
 * acquired the GIL for thread state acquired_for (its slot's tstate). */
GIL_INLINE void gil_locate(struct gil_header *h, struct gil_location *loc, __u64 hold, __u64 acquired_for,
			   GIL_WHERE where)
{
	const struct gil_py_layout *py = &h->py;
	/* why and nframes change in the record itself, not in registers: the BPF verifier then
	 * knows neither, where it would follow one path per combination of their values. */
	volatile __u32 *why = &loc->why, *nframes = &loc->nframes;
	int failed = 0;
	loc->seq = 2 * hold + 1;
	*why = 0;
	*nframes = 0;
	__builtin_memset(loc->frames, 0, sizeof(loc->frames));
	if (!py->minor) {
		*why |= 1U << GIL_LOC_NO_LAYOUT;
		goto done;
	}
	__u64 tstate = gil_read_u64(h->gil_cond + py->gil_last_holder, &failed);
	if (failed) {
		*why |= 1U << GIL_LOC_UNREADABLE;
		goto done;
	}
	if (!tstate || tstate != acquired_for) {
		*why |= 1U << GIL_LOC_HOLDER;
		goto done;
	}
	__u64 frame = gil_read_u64(tstate + py->tstate_frame, &failed);
	if (frame && py->cframe_frame >= 0)
		frame = gil_read_u64(frame + py->cframe_frame, &failed);
	/* The walk: the innermost Python frames' code objects and instruction offsets... */
	__u64 codes[GIL_LOC_FRAMES];
	long addrs[GIL_LOC_FRAMES];
	__u32 found = 0;
	for (int walked = 0; walked < GIL_FRAMES_WALKED && frame && !failed && found < GIL_LOC_FRAMES; walked++) {
		__u64 here = frame;
		frame = gil_read_u64(here + py->frame_previous, &failed);
		__u64 code = gil_read_u64(here + py->frame_code, &failed) & ~(__u64)py->code_tag_bits;
		__u8 owned_by = 0;
		if (py->frame_kind == GIL_FRAME_INTERP && GIL_READ(&owned_by, 1, here + py->frame_owner))
			failed = 1;
		if (failed)
			break;
		if (py->skip_owner && owned_by >= py->skip_owner)
			continue; /* the interpreter's own frame: a C call's, an entry frame */
		if (!code || gil_read_u64(code + py->ob_type, &failed) != py->code_type) {
			if (!failed)
				*why |= 1U << GIL_LOC_NOT_CODE;
			break;
		}
		long addr; /* byte offset of the instruction being run in the code's bytecode */
		if (py->frame_kind == GIL_FRAME_INTERP) {
			addr = (long)(gil_read_u64(here + py->frame_instr, &failed) - (code + py->code_code));
			if (owned_by != GIL_FRAME_OWNED_BY_GENERATOR &&
			    addr < 2 * (long)(int)gil_read_u32(code + py->code_firsttraceable, &failed))
				continue; /* not started yet (_PyFrame_IsIncomplete) */
		} else {
			addr = (long)(int)gil_read_u32(here + py->frame_instr, &failed) * py->lasti_scale;
		}
		if (failed)
			break;
		codes[found & (GIL_LOC_FRAMES - 1)] = code;
		addrs[found & (GIL_LOC_FRAMES - 1)] = addr;
		found++;
	}
	if (failed)
		*why |= 1U << GIL_LOC_UNREADABLE;
	*nframes = found;
	/* ... then their names, files and lines. */
	for (__u32 i = 0; i < GIL_LOC_FRAMES; i++) {
		if (i >= *nframes)
			break;
		struct gil_frame *f = &loc->frames[i & (GIL_LOC_FRAMES - 1)];
		int missing = gil_read_frame(py, codes[i & (GIL_LOC_FRAMES - 1)], addrs[i & (GIL_LOC_FRAMES - 1)], i, f, where);
		if (missing >= 0)
			*why |= 1U << missing;
		if (missing >= 0 && missing != GIL_LOC_NO_LINE) { /* without its line, a frame stands */
			__builtin_memset(f, 0, sizeof(*f));
			*nframes = i;
			break;
		}
	}
	if (!*nframes && !*why)
		*why |= 1U << GIL_LOC_NO_FRAME;
done:
	GIL_PUBLISH(&loc->seq, 2 * hold + 2);
	h->locations_written++;
	__u32 bits = *why;
	for (int i = 0; i < GIL_LOC_WHYS; i++)
		h->location_misses[i] += (bits >> i) & 1;
}

#endif
