/* GOT patching of the ELF object that holds the interpreter (got_patch.c): its calls of
 * a few libc functions go to hooks instead, until restored. Used by _inprocess.c, whose
 * table of hooked symbols says which.
 */
#ifndef OTEL_GIL_GOT_PATCH_H
#define OTEL_GIL_GOT_PATCH_H

#define HIDDEN __attribute__((visibility("hidden")))

/* A symbol the interpreter calls through its GOT, the hook to call instead, and where
 * the real function (dlsym(RTLD_DEFAULT), never the GOT's value, which on lazy-binding
 * builds is a PLT stub whose resolver would overwrite the hook) is stored for the hook. */
struct got_hook {
	const char *symbol;
	void *hook;
	void **real;
};

/* A GOT entry patched. */
struct got_entry {
	void **address; /* the GOT slot */
	void *original; /* its value before got_patch */
	const struct got_hook *hooked;
	int relro;      /* in a page ld.so made read-only */
};

#define GOT_UNSUPPORTED -1 /* got_error() says why; nothing changed */
#define GOT_ERRNO -2       /* a page's protection could not be changed (errno); nothing changed */

/* Point the interpreter's GOT entries of every symbol in hooks[0..n) to its hook (the
 * entries are found on the first call, then reused): 0, GOT_UNSUPPORTED or GOT_ERRNO. */
HIDDEN int got_patch(const struct got_hook *hooks, int n, const void *inside_interpreter);

/* Put back the original value of every entry that still holds its hook. */
HIDDEN void got_restore(void);

/* Why got_patch failed (GOT_UNSUPPORTED). */
HIDDEN const char *got_error(void);

/* The ELF object patched (or being looked for), for messages. */
HIDDEN const char *got_object(void);

/* The entries found: *n of them. */
HIDDEN const struct got_entry *got_entries(int *n);

#endif
