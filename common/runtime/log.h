/* log: JSON lines on stderr, one object per event.
 *
 *   log_info("attempt claimed", "payment_attempt_id", id, "order_id", oid, NULL);
 *
 * Fields are key/value string pairs ending in NULL; a NULL value is left out.
 * Every value that contains a registered secret has it replaced by
 * "[redacted]", so a secret never reaches a log line even by accident.
 * Safe to call from several threads. */
#ifndef CHARGED_LOG_H
#define CHARGED_LOG_H

#include <stddef.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF };

/* Returns the level named by s ("debug", "info", "warn", "error") or -1. */
int log_level_parse(const char *s);

/* Program name written with each line, and the lowest level written. */
void log_init(const char *program, enum log_level level);

/* Registers a value that must never be printed. Copies it; as many as are
 * given are kept. Values shorter than 4 bytes are ignored: redacting them
 * would garble every line. Returns 0, or -1 when memory ran out: the secret
 * is not registered, and the caller must not go on to print it. */
int log_add_secret(const char *secret);
/* Forgets every registered secret (tests, shutdown). */
void log_clear_secrets(void);

void log_write(enum log_level level, const char *msg, ...) __attribute__((sentinel));
#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

/* Writes `in` to `out` (size out_size) with registered secrets replaced.
 * Used by log_write and by anything that echoes text from outside. */
void log_redact(const char *in, char *out, size_t out_size);

#endif
