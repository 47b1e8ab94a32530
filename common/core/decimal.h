/* decimal: whole numbers as people and other programs write them in
 * options, positions and parameters: digits only. strtol would take " 5"
 * and "+5" and clamp what overflows into a number nobody wrote. */
#ifndef CHARGED_DECIMAL_H
#define CHARGED_DECIMAL_H

#include <stdint.h>

/* A decimal number, digits only (no sign, space or anything after it), in
 * 0..max -> *out; the digits end at *rest when rest is given, else at the
 * end of s. 0 / -1 (also when it would overflow, and for NULL). */
int decimal_parse(const char *s, int64_t max, int64_t *out, const char **rest);

#endif
