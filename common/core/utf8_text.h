/* utf8_text: text from outside parties (provider answers, commands), made
 * safe to store and log.
 *
 * PostgreSQL refuses invalid UTF-8 and NUL bytes, and one refused value used
 * to fail a whole batch. Everything that reaches the database from outside
 * goes through here first: it is valid UTF-8, has no control characters and
 * fits its buffer without a character cut in half. */
#ifndef CHARGED_UTF8_TEXT_H
#define CHARGED_UTF8_TEXT_H

#include <stddef.h>

/* Copies src (NULL reads as "") into dst of dst_size bytes, NUL-terminated.
 * Invalid sequences become '?'; control characters (C0, DEL, C1), the line
 * and paragraph separators (U+2028, U+2029) and invisible format characters
 * (zero-width, bidirectional overrides and isolates, BOM) become ' '; and
 * the copy stops before a character that would not fit whole. Returns
 * the bytes written, without the NUL. dst_size 0 writes nothing. */
size_t utf8_text_copy(char *dst, size_t dst_size, const char *src);

/* Length in bytes of the valid UTF-8 sequence at s (at most n bytes), or 0
 * when s does not start with one. Overlong forms, surrogates and code
 * points above U+10FFFF are invalid. */
size_t utf8_text_seq_len(const unsigned char *s, size_t n);

/* 1 if the n bytes at s are valid UTF-8 without NUL. */
int utf8_text_valid(const char *s, size_t n);

/* 1 if s (NULL: no) is free text a person typed for a record, as names,
 * actors and reasons are: 1..max bytes of valid UTF-8 on one line, with
 * nothing utf8_text_copy would replace (no control, no line or paragraph
 * separator, no invisible format character), so that it reads as it is. */
int utf8_text_line(const char *s, size_t max);

/* Characters (Unicode code points) in the n bytes at s, which must be valid
 * UTF-8: what the contract's and JSON Schema's lengths count. */
size_t utf8_text_chars(const char *s, size_t n);

#endif
