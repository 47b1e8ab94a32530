/* traceparent: the W3C Trace Context header that ties a charge command to
 * the trace of whoever sent it.
 *
 * Pure. Only version 00 is read: "00-" 32 lower-case hex digits (the trace
 * id, not all zeros) "-" 16 (the parent id, not all zeros) "-" 2 (the
 * flags), 55 bytes in all. Anything else is not a traceparent and is
 * ignored whole: no byte of it is ever passed on. */
#ifndef CHARGED_TRACEPARENT_H
#define CHARGED_TRACEPARENT_H

#include <stddef.h>

#define TRACEPARENT_LEN 55

/* 1 when value (len bytes, not NUL-terminated; may be NULL) is a valid
 * traceparent: out (TRACEPARENT_LEN + 1 bytes) holds it as a string. 0
 * otherwise, and out is "". */
int traceparent_parse(const void *value, size_t len, char *out);

#endif
