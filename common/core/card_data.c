#include "card_data.h"

#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "utf8_text.h"

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_alnum(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* A candidate: digits, optionally grouped by single spaces or hyphens. */
struct run {
    size_t start, end; /* end: one past the last digit */
    int ndigits;
    int groups[8];
    int ngroups; /* > 8: too many to be a card */
};

/* The run at i of at most max_groups groups (0: any number). */
static void scan_run(const char *buf, size_t len, size_t i, int max_groups,
                     struct run *r)
{
    CHARGED_ASSERT(buf && r && i <= len);
    memset(r, 0, sizeof(*r));
    r->start = r->end = i;
    r->ngroups = 1;
    while (i < len) {
        if (is_digit(buf[i])) {
            r->ndigits++;
            if (r->ngroups <= 8)
                r->groups[r->ngroups - 1]++;
            r->end = ++i;
            continue;
        }
        if ((buf[i] == ' ' || buf[i] == '-') && i + 1 < len && is_digit(buf[i + 1]) &&
            (max_groups == 0 || r->ngroups < max_groups)) {
            r->ngroups++;
            i++;
            continue;
        }
        break;
    }
    CHARGED_ASSERT(r->start <= r->end && r->end <= len);
}

/* Grouped the way cards are printed: 4-4-4-4(-3), 4-6-5 or 4-6-4. */
static int card_grouping(const struct run *r)
{
    if (r->ngroups == 1)
        return 1;
    if (r->ngroups > 8)
        return 0;
    if (r->ngroups == 3 && r->groups[0] == 4 && r->groups[1] == 6 &&
        (r->groups[2] == 5 || r->groups[2] == 4))
        return 1;
    for (int g = 0; g < r->ngroups - 1; g++)
        if (r->groups[g] != 4)
            return 0;
    return r->groups[r->ngroups - 1] >= 1 && r->groups[r->ngroups - 1] <= 4;
}

/* Part of a longer token, such as a UUID ("...-1234-5678...") or an id. */
static int inside_token(const char *buf, size_t len, const struct run *r)
{
    size_t s = r->start, e = r->end;
    if (s > 0 && is_alnum(buf[s - 1]))
        return 1;
    if (s > 1 && buf[s - 1] == '-' && is_alnum(buf[s - 2]))
        return 1;
    if (e < len && is_alnum(buf[e]))
        return 1;
    if (e + 1 < len && buf[e] == '-' && is_alnum(buf[e + 1]))
        return 1;
    return 0;
}

static int luhn_ok(const char *buf, size_t start, size_t end)
{
    int sum = 0, dbl = 0;
    CHARGED_ASSERT(buf && start < end);
    for (size_t i = end; i > start; i--) {
        char c = buf[i - 1];
        if (!is_digit(c))
            continue;
        int d = c - '0';
        if (dbl) {
            d *= 2;
            if (d > 9)
                d -= 9;
        }
        sum += d;
        dbl = !dbl;
    }
    return sum % 10 == 0;
}

static int is_pan(const char *buf, size_t len, const struct run *r)
{
    return r->ndigits >= 13 && r->ndigits <= 19 && buf[r->start] >= '2' &&
           buf[r->start] <= '6' && card_grouping(r) && !inside_token(buf, len, r) &&
           luhn_ok(buf, r->start, r->end);
}

/* Overwrites the digits of r in buf, but the last four, with '*'; returns
 * where the four kept start. */
static size_t mask_run(char *buf, const struct run *r)
{
    int keep = 4;
    size_t kept = r->start;
    /* Only a card's number is masked: 13 to 19 digits. */
    CHARGED_ASSERT(r->ndigits >= 13 && r->ndigits <= 19);
    for (size_t j = r->end; j > r->start; j--) {
        if (!is_digit(buf[j - 1]))
            continue;
        if (keep > 0) {
            keep--;
            kept = j - 1;
        } else {
            buf[j - 1] = '*';
        }
    }
    /* Its last four digits kept, the rest masked. */
    CHARGED_ASSERT(kept > r->start && kept < r->end);
    return kept;
}

/* A card grouped with 5 groups at most (4-4-4-4-3). */
#define CARD_MAX_GROUPS 5

/* Counts (and, with buf, masks) the card numbers in cbuf. */
static size_t each_pan(char *buf, const char *cbuf, size_t len, int mask)
{
    size_t n = 0, i = 0;
    CHARGED_ASSERT(cbuf && (buf || !mask));
    while (i < len) {
        if (!is_digit(cbuf[i]) || (i > 0 && is_digit(cbuf[i - 1]))) {
            i++;
            continue;
        }
        struct run r;
        scan_run(cbuf, len, i, 0, &r);
        int whole = is_pan(cbuf, len, &r);
        size_t g = r.start;
        if (whole) {
            n++;
            if (mask)
                g = mask_run(buf, &r);
        }
        if ((whole && mask) || (!whole && r.ngroups > 1)) {
            /* A card next to other digits ("qty 2 4242...", two cards in a
             * row) is not the whole run: every window of whole groups that
             * starts at a group is one too. Once masked, the four digits
             * kept can start one with the groups after: looked at in this
             * pass, not one pass per card (quadratic on a chain). */
            while (g < r.end) {
                struct run w;
                int found = 0;
                for (int k = 1; k <= CARD_MAX_GROUPS && !found; k++) {
                    scan_run(cbuf, len, g, k, &w);
                    if (w.ngroups < k)
                        break; /* the run ends here */
                    found = is_pan(cbuf, len, &w);
                }
                if (found) {
                    n++;
                    if (mask) {
                        g = mask_run(buf, &w);
                        continue;
                    }
                    g = w.end;
                } else {
                    while (g < r.end && is_digit(cbuf[g]))
                        g++;
                }
                g++; /* past the separator, to the next group */
            }
        }
        i = r.end > i ? r.end : i + 1;
    }
    return n;
}

int card_data_found(const char *buf, size_t len)
{
    return buf && each_pan(NULL, buf, len, 0) > 0;
}

size_t card_data_mask(char *buf, size_t len)
{
    /* Until nothing is left: the four digits a window keeps can start a
     * card-shaped run with the groups after it (found by fuzz_card_data). */
    size_t total = 0, n;
    while (buf && (n = each_pan(buf, buf, len, 1)) > 0)
        total += n;
    return total;
}

/* ---- shown text: any grouping, any separators ---- */

/* What may stand between the digit groups of a number someone means to
 * show: anything but a letter or a digit (spaces, tabs, punctuation, '*',
 * the bytes of NBSP, of a zero-width space, of a letter of another
 * script). */
static int separator(char c)
{
    return !is_alnum(c);
}

static int is_hex(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A UUID (8-4-4-4-12 hex digits) starts at i: an id, not text. Its groups
 * of digits are never read as a card's (two of them would make one now
 * and then, and a masked order or attempt id would match nothing). */
static int uuid_at(const char *buf, size_t len, size_t i)
{
    static const char shape[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    CHARGED_ASSERT(i <= len);
    if (len - i < sizeof(shape) - 1 || (i > 0 && is_hex(buf[i - 1])))
        return 0;
    for (size_t k = 0; k < sizeof(shape) - 1; k++)
        if (shape[k] == '-' ? buf[i + k] != '-' : !is_hex(buf[i + k]))
            return 0;
    return 1;
}

/* The longest card number of whole digit groups that starts with the
 * group at i, the groups joined by runs of separators: *r, or 0. */
static int separated_pan(const char *buf, size_t len, size_t i, struct run *r)
{
    int digits = 0, found = 0;
    size_t at = i;
    CHARGED_ASSERT(i < len && r);
    if (buf[i] < '2' || buf[i] > '6')
        return 0;
    for (;;) {
        size_t end = at;
        while (end < len && is_digit(buf[end]))
            end++;
        digits += (int)(end - at);
        if (digits > 19)
            break;
        if (digits >= 13 && luhn_ok(buf, i, end)) {
            *r = (struct run){.start = i, .end = end, .ndigits = digits};
            found = 1;
        }
        while (end < len && separator(buf[end]))
            end++;
        if (end >= len || !is_digit(buf[end]) || uuid_at(buf, len, end))
            break;
        at = end;
    }
    return found;
}

/* Masks every card number of whole digit groups joined by separators, in
 * one pass from the left: a number masked, the four digits kept are
 * looked at again as a group of their own with the groups after them.
 * Each group starts at most one look of 19 digits ahead: linear. (The
 * digits before a masked number, the four kept and those after can make
 * one more number through the mask's '*': none anyone wrote, not looked
 * for.) */
static size_t mask_separated(char *buf, size_t len)
{
    size_t masked = 0;
    for (size_t i = 0; i < len;) {
        if (uuid_at(buf, len, i)) {
            i += 36;
            continue;
        }
        if (!is_digit(buf[i]) || (i > 0 && is_digit(buf[i - 1]))) {
            i++;
            continue;
        }
        struct run r;
        if (separated_pan(buf, len, i, &r)) {
            masked++;
            i = mask_run(buf, &r);
            continue;
        }
        while (i < len && is_digit(buf[i]))
            i++;
    }
    return masked;
}

size_t card_data_mask_loose(char *buf, size_t len)
{
    if (!buf)
        return 0;
    return card_data_mask(buf, len) + mask_separated(buf, len);
}

size_t card_data_copy_masked(char *dst, size_t size, const char *src)
{
    char small[512];
    size_t len = src ? strlen(src) : 0, masked = 0;
    if (size == 0)
        return 0; /* before the copy is taken: nothing to free */
    CHARGED_ASSERT(dst);
    char *copy = len < sizeof(small) ? small : malloc(len + 1);
    if (!copy) {
        dst[0] = '\0'; /* nothing rather than a number unmasked */
        return 0;
    }
    /* Made text first, then masked: the copy turns a TAB or a zero-width
     * space between groups into a space (never longer: one character for
     * one), and the mask must see what is shown. Masked on the whole text,
     * then bounded: a number the bound cuts is masked all the same. */
    utf8_text_copy(copy, len + 1, src);
    masked = card_data_mask_loose(copy, strlen(copy));
    utf8_text_copy(dst, size, copy);
    if (copy != small)
        free(copy);
    return masked;
}
