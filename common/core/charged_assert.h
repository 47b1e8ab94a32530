/* charged_assert: assertions that guard money, on in every build.
 *
 * assert() vanishes under NDEBUG; these never do. A broken state found on
 * the money path (a job moved where it may not go, an epoch that went
 * back, an amount beyond its reservation, an offset committed for work not
 * durable) stops the process before anything more is written or
 * committed: the supervisor restarts it, the lease fences the record, and
 * the message is consumed again. Carrying on would commit over the break.
 *
 * Use it for what must be true whatever the input; bad input is an error
 * the caller reports, never an assertion. */
#ifndef CHARGED_ASSERT_H
#define CHARGED_ASSERT_H

/* The file's own name where the compiler knows it (no build path). */
#ifdef __FILE_NAME__
#define CHARGED_ASSERT_FILE __FILE_NAME__
#else
#define CHARGED_ASSERT_FILE __FILE__
#endif

#define CHARGED_ASSERT(cond)                                                           \
    ((cond) ? (void)0                                                                  \
            : charged_assert_failed(#cond, CHARGED_ASSERT_FILE, __LINE__, __func__))

/* Writes one line naming the assertion and where it failed to stderr
 * (the log's JSON shape, without the clock: the core has none), then
 * aborts. */
_Noreturn void charged_assert_failed(const char *expr, const char *file, int line,
                                     const char *func);

#endif
