/* clock: the one monotonic clock for timers and the one RFC 3339 formatter
 * and parser.
 *
 * Timers, back-offs, leases and deadlines use clock_now_ms(): a step of the
 * wall clock must not move them. Wall time is only for what people and
 * other systems read (timestamps in logs, headers, tables). */
#ifndef CHARGED_CLOCK_H
#define CHARGED_CLOCK_H

#include <stddef.h>
#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC: only differences mean anything. */
int64_t clock_now_ms(void);

/* Milliseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t clock_wall_ms(void);

/* Writes wall_ms as RFC 3339 UTC with milliseconds, e.g.
 * "2026-11-30T05:20:37.123Z" (24 bytes and the NUL). Returns buf. */
#define CLOCK_RFC3339_SIZE 32
char *clock_rfc3339(int64_t wall_ms, char *buf, size_t size);

/* "15m", "2h", "7d", "30s" -> milliseconds. 0 / -1. */
int clock_parse_duration_ms(const char *s, int64_t *ms);
/* An RFC 3339 UTC time ("2026-11-30T05:20:37Z", fractions allowed, "Z" or
 * "+00:00") -> ms since the epoch. 0 / -1. */
int clock_parse_rfc3339(const char *s, int64_t *wall_ms);
/* An RFC 3339 UTC time or a duration meaning that long ago -> ms since the
 * epoch: what --since and --until take. 0 / -1. */
int clock_parse_time_ms(const char *s, int64_t *epoch_ms);

#endif
