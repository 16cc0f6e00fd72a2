/* A clock in nanoseconds: CLOCK_MONOTONIC is the slots' (the BPF writer's bpf_ktime_get_ns()). */
#ifndef OTEL_GIL_CLOCK_NS_H
#define OTEL_GIL_CLOCK_NS_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#endif
