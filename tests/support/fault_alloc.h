/* fault_alloc: makes the Nth allocation fail, so that a test can run every
 * out-of-memory branch of an operation, as SQLite's faultsim and curl's
 * `runtests -t` do.
 *
 * Only for a test executable linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,
 *   --wrap=strndup,--wrap=free
 * (and --wrap=json_loadb,--wrap=json_dumps), with the modules under test linked
 * statically into it: the linker then sends their calls here. jansson and OpenSSL
 * allocate inside their own libraries, so fault_alloc_install() routes them here too.
 * Underneath is the real allocator (which valgrind and ASan watch as usual).
 *
 * While armed, every allocation is counted; the one numbered fail_at (from
 * 1) fails, and with `persistent` every one after it too. Allocations made
 * by our code and jansson while armed are tracked until freed: what is
 * still live at fault_alloc_disarm() is what the operation kept (or
 * leaked). A json_loadb() or json_dumps() is one allocation (fault_alloc.c says why).
 * Only the thread that armed is counted; other threads' allocations pass straight
 * through. */
#ifndef CHARGED_FAULT_ALLOC_H
#define CHARGED_FAULT_ALLOC_H

#include <stddef.h>

/* Routes jansson and OpenSSL through the counter. Call first thing in
 * main(), before OpenSSL allocates: 0, or -1 when OpenSSL refused. */
int fault_alloc_install(void);

/* Starts counting. fail_at 0 fails nothing (a counting run). */
void fault_alloc_arm(long fail_at, int persistent);

struct fault_alloc_result {
    long allocations; /* attempted while armed, the failed ones included */
    long failed;      /* how many were made to fail */
    long live;        /* tracked allocations not freed at disarm */
    int overflow;     /* more live allocations than the tracker holds */
};

/* Stops counting and says what happened since fault_alloc_arm(). */
struct fault_alloc_result fault_alloc_disarm(void);

#endif
