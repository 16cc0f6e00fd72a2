/* GOT patching of one loaded ELF object (got_patch.c): its calls of a few functions go
 * to hooks instead, until restored. Used by _inprocess.c (the interpreter's calls of
 * pthread_cond_*) and context_switches.c (an extension module's calls of
 * PyContext_Enter/Exit), each with its own table of hooked symbols and its own struct got.
 */
#ifndef OTEL_GIL_GOT_PATCH_H
#define OTEL_GIL_GOT_PATCH_H

#define HIDDEN __attribute__((visibility("hidden")))

/* A symbol the object calls through its GOT, the hook to call instead, and where
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

#define MAX_GOT 8

/* One object's patch: zero-initialized before its first got_patch. */
struct got {
	struct got_entry entries[MAX_GOT];
	int n;            /* entries found (on the first got_patch, then reused) */
	char object[512]; /* the ELF object patched (or being looked for), for messages */
	char error[768];  /* why got_patch failed (GOT_UNSUPPORTED) */
};

#define GOT_UNSUPPORTED -1 /* got->error says why; nothing changed */
#define GOT_ERRNO -2       /* a page's protection could not be changed (errno); nothing changed */

/* Point the GOT entries of every symbol in hooks[0..n) of the ELF object that holds the
 * address `inside` to its hook: 0, GOT_UNSUPPORTED or GOT_ERRNO. */
HIDDEN int got_patch(struct got *got, const struct got_hook *hooks, int n, const void *inside);

/* Put back the original value of every entry that still holds its hook. */
HIDDEN void got_restore(struct got *got);

#endif
