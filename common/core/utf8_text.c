#include "utf8_text.h"

#include <string.h>

#include "charged_assert.h"

size_t utf8_text_seq_len(const unsigned char *s, size_t n)
{
    CHARGED_ASSERT(s || n == 0);
    if (n == 0)
        return 0;
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned min;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    CHARGED_ASSERT(len >= 2 && len <= 4 && len <= n);
    return len;
}

int utf8_text_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    CHARGED_ASSERT(s || n == 0);
    for (size_t i = 0; i < n;) {
        size_t l = utf8_text_seq_len(p + i, n - i);
        if (l == 0 || p[i] == 0)
            return 0;
        i += l;
    }
    return 1;
}

size_t utf8_text_chars(const char *s, size_t n)
{
    size_t chars = 0;
    CHARGED_ASSERT(s || n == 0);
    /* In valid UTF-8 every character has exactly one byte that is not a
     * continuation byte (10xxxxxx). */
    for (size_t i = 0; i < n; i++)
        chars += ((unsigned char)s[i] & 0xc0) != 0x80;
    return chars;
}

/* Format characters that change how text around them reads without being
 * seen: zero-width ones, bidirectional overrides and isolates, the BOM. A
 * reason or log line quoting an outside party must read as it is. */
static int invisible(unsigned cp)
{
    return (cp >= 0x200b && cp <= 0x200f) || (cp >= 0x202a && cp <= 0x202e) ||
           (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x2069) ||
           cp == 0xfeff;
}

/* What text must not carry as it is: controls (C0, DEL, C1), the line and
 * paragraph separators (a line break by another name), and invisible
 * format characters. */
static int unseen(unsigned cp)
{
    return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0) || cp == 0x2028 ||
           cp == 0x2029 || invisible(cp);
}

/* The code point of the valid sequence of l bytes at s (4-byte ones are
 * never unseen, so they need no decoding here: 0x10000 stands for them). */
static unsigned code_point(const unsigned char *s, size_t l)
{
    CHARGED_ASSERT(s && l >= 1 && l <= 4);
    if (l == 2)
        return ((s[0] & 0x1fu) << 6) | (s[1] & 0x3fu);
    if (l == 3)
        return ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
    return l == 1 ? s[0] : 0x10000;
}

size_t utf8_text_copy(char *dst, size_t dst_size, const char *src)
{
    const unsigned char *s = (const unsigned char *)(src ? src : "");
    size_t n = strlen((const char *)s), out = 0;

    if (dst_size == 0)
        return 0;
    CHARGED_ASSERT(dst);
    for (size_t i = 0; i < n;) {
        size_t l = utf8_text_seq_len(s + i, n - i);
        const unsigned char *from = s + i;
        unsigned char repl;
        if (l == 0) {
            repl = '?';
            from = &repl;
            l = 1;
            i++;
        } else {
            unsigned cp = code_point(s + i, l);
            i += l;
            if (unseen(cp)) {
                repl = ' ';
                from = &repl;
                l = 1;
            }
        }
        if (out + l >= dst_size)
            break;
        memcpy(dst + out, from, l);
        out += l;
    }
    CHARGED_ASSERT(out < dst_size); /* room for the NUL, always */
    dst[out] = '\0';
    return out;
}

int utf8_text_line(const char *s, size_t max)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 0, l; i < n; i += l)
        if (!(l = utf8_text_seq_len(u + i, n - i)) || unseen(code_point(u + i, l)))
            return 0;
    return 1;
}
