/* GOT patching (got_patch.h): an ELF object calls other objects' functions through its
 * GOT (JUMP_SLOT relocations, or GLOB_DAT in -fno-plt builds). got_patch() finds the
 * object that holds a given address (dl_iterate_phdr), collects the GOT entries of the
 * hooked symbols from its dynamic relocations, and swaps each for its hook with one
 * aligned store, through a writable window where ld.so made the page read-only (full RELRO).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "got_patch.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
#define R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define R_GLOB_DAT R_AARCH64_GLOB_DAT
#else
#define MACHINE_UNKNOWN /* got_patch says so, and finds nothing (no relocation has these types) */
#define R_JUMP_SLOT (~0UL)
#define R_GLOB_DAT (~0UL)
#endif

struct search {
	struct got *got;
	uintptr_t inside; /* an address inside the object */
	const struct got_hook *hooks;
	int nhooks;
	int found;
	const char *error;
};

static uintptr_t dyn_ptr(ElfW(Addr) base, ElfW(Addr) value)
{
	/* ld.so relocates these in place where the dynamic section is writable. */
	return value < base ? base + value : value;
}

static int is_relro(const struct dl_phdr_info *info, uintptr_t address)
{
	long page = sysconf(_SC_PAGESIZE);
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_GNU_RELRO)
			continue;
		uintptr_t start = (info->dlpi_addr + ph->p_vaddr) & ~(uintptr_t)(page - 1);
		uintptr_t end = (info->dlpi_addr + ph->p_vaddr + ph->p_memsz) & ~(uintptr_t)(page - 1);
		return address >= start && address < end; /* what ld.so's _dl_protect_relro protects */
	}
	return 0;
}

static const struct got_hook *hook_of(const struct search *search, const char *name)
{
	for (int i = 0; i < search->nhooks; i++)
		if (strcmp(name, search->hooks[i].symbol) == 0)
			return &search->hooks[i];
	return NULL;
}

static void collect_relocs(const struct search *search, struct dl_phdr_info *info, const ElfW(Rela) *rel,
			   size_t size, const ElfW(Sym) *symtab, const char *strtab)
{
	for (size_t i = 0; i < size / sizeof(ElfW(Rela)); i++) {
		unsigned long type = ELF64_R_TYPE(rel[i].r_info);
		if (type != R_JUMP_SLOT && type != R_GLOB_DAT)
			continue;
		const struct got_hook *hooked = hook_of(search, strtab + symtab[ELF64_R_SYM(rel[i].r_info)].st_name);
		struct got *got = search->got;
		if (hooked == NULL || got->n == MAX_GOT)
			continue;
		uintptr_t address = info->dlpi_addr + rel[i].r_offset;
		got->entries[got->n].address = (void **)address;
		got->entries[got->n].hooked = hooked;
		got->entries[got->n].relro = is_relro(info, address);
		got->n++;
	}
}

static int find_object(struct dl_phdr_info *info, size_t size, void *data)
{
	struct search *search = data;
	const ElfW(Dyn) *dyn = NULL;
	int inside = 0;
	(void)size;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t start = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && search->inside >= start && search->inside < start + ph->p_memsz)
			inside = 1;
		else if (ph->p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
	}
	if (!inside)
		return 0;
	search->found = 1;
	snprintf(search->got->object, sizeof(search->got->object), "%s", info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "the executable");
	if (dyn == NULL) {
		search->error = "has no dynamic section (a fully static build has no GOT to hook)";
		return 1;
	}
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const ElfW(Rela) *jmprel = NULL, *rela = NULL;
	size_t jmprel_size = 0, rela_size = 0;
	for (; dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(info->dlpi_addr, dyn->d_un.d_ptr); break;
		case DT_STRTAB: strtab = (const char *)dyn_ptr(info->dlpi_addr, dyn->d_un.d_ptr); break;
		case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_ptr(info->dlpi_addr, dyn->d_un.d_ptr); break;
		case DT_PLTRELSZ: jmprel_size = dyn->d_un.d_val; break;
		case DT_RELA: rela = (const ElfW(Rela) *)dyn_ptr(info->dlpi_addr, dyn->d_un.d_ptr); break;
		case DT_RELASZ: rela_size = dyn->d_un.d_val; break;
		}
	}
	if (symtab == NULL || strtab == NULL) {
		search->error = "has no dynamic symbol table";
		return 1;
	}
	if (jmprel != NULL)
		collect_relocs(search, info, jmprel, jmprel_size, symtab, strtab);
	if (rela != NULL)
		collect_relocs(search, info, rela, rela_size, symtab, strtab);
	return 1;
}

/* The entries of every hooked symbol, and the real functions; 0, or GOT_UNSUPPORTED. */
static int find_entries(struct got *got, const struct got_hook *hooks, int n, const void *inside)
{
	struct search search = {got, (uintptr_t)inside, hooks, n, 0, NULL};
	dl_iterate_phdr(find_object, &search);
	if (!search.found || search.error) {
		snprintf(got->error, sizeof(got->error), "the ELF object (%s) %s", search.found ? got->object : "?",
			 search.found ? search.error : "was not found among the loaded objects");
		return GOT_UNSUPPORTED;
	}
	for (int h = 0; h < n; h++) {
		int found = 0;
		for (int i = 0; i < got->n; i++)
			found |= got->entries[i].hooked == &hooks[h];
		if (!found) {
			snprintf(got->error, sizeof(got->error), "%s calls %s through no GOT entry (a static or unusual "
				 "build)", got->object, hooks[h].symbol);
			return GOT_UNSUPPORTED;
		}
		if ((*hooks[h].real = dlsym(RTLD_DEFAULT, hooks[h].symbol)) == NULL) {
			snprintf(got->error, sizeof(got->error), "dlsym found no %s", hooks[h].symbol);
			return GOT_UNSUPPORTED;
		}
	}
	return 0;
}

/* One aligned 8-byte store (atomic on every supported machine). */
static int store_got(const struct got_entry *entry, void *value)
{
	long page = sysconf(_SC_PAGESIZE);
	void *start = (void *)((uintptr_t)entry->address & ~(uintptr_t)(page - 1));
	if (entry->relro && mprotect(start, (size_t)page, PROT_READ | PROT_WRITE) != 0)
		return -1;
	__atomic_store_n(entry->address, value, __ATOMIC_SEQ_CST);
	if (entry->relro && mprotect(start, (size_t)page, PROT_READ) != 0)
		return -1;
	return 0;
}

int got_patch(struct got *got, const struct got_hook *hooks, int n, const void *inside)
{
#ifdef MACHINE_UNKNOWN
	snprintf(got->error, sizeof(got->error), "the GOT relocations of x86_64 and aarch64 only are known");
	return GOT_UNSUPPORTED;
#endif
	if (got->n == 0) {
		int failed = find_entries(got, hooks, n, inside);
		if (failed) {
			got->n = 0;
			return failed;
		}
	}
	for (int i = 0; i < got->n; i++) {
		struct got_entry *entry = &got->entries[i];
		if (*entry->address == entry->hooked->hook)
			continue; /* patched already: its original stays the one saved then */
		entry->original = *entry->address;
		if (store_got(entry, entry->hooked->hook) != 0) {
			int saved = errno;
			got_restore(got);
			errno = saved;
			return GOT_ERRNO;
		}
	}
	return 0;
}

void got_restore(struct got *got)
{
	for (int i = 0; i < got->n; i++)
		if (*got->entries[i].address == got->entries[i].hooked->hook)
			store_got(&got->entries[i], got->entries[i].original);
}
