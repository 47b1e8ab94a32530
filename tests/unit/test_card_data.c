/* Unit tests of common/core/card_data: what counts as a card number, and masking. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "card_data.h"
#include "test_env.h"

static int found(const char *s)
{
    return card_data_found(s, strlen(s));
}

START_TEST(finds_plain_and_grouped_card_numbers)
{
    ck_assert(found("4242424242424242"));
    ck_assert(found("{\"pm\":\"4242424242424242\"}"));
    ck_assert(found("card 4242 4242 4242 4242 end"));
    ck_assert(found("5555-5555-5555-4444"));
    ck_assert(found("378282246310005"));   /* Amex, 15 digits */
    ck_assert(found("3782 822463 10005")); /* Amex grouping */
    /* Next to other digits, by a space: found by fuzz_card_data. */
    ck_assert(found("qty 2 4242424242424242"));
    ck_assert(found("4242424242424242 1"));
    ck_assert(found("4111111111111111 5555555555554444"));
    ck_assert(found("1 4242 4242 4242 4242 1"));
}
END_TEST

START_TEST(ignores_what_is_not_a_card)
{
    ck_assert(!found("4242424242424241"));                     /* fails Luhn */
    ck_assert(!found("100000000000"));                         /* an amount */
    ck_assert(!found("1732900000000"));                        /* ms timestamp */
    ck_assert(!found("12345678-1234-1234-1234-424242424242")); /* UUID */
    ck_assert(!found("5d1c2c1e-4242-4242-4242-424242424242"));
    ck_assert(!found("pi3a4242424242424242")); /* inside an id */
    ck_assert(found("tok_4242424242424242"));  /* after a separator: still a card */
    ck_assert(!found("42424242424242424242")); /* 20 digits */
    ck_assert(!found("4242-424242424242"));    /* not card grouping */
    ck_assert(!found("1-4242424242424242"));   /* hyphen-joined: a token */
    ck_assert(!found(""));
}
END_TEST

START_TEST(masks_all_but_the_last_four_in_place)
{
    char buf[] = "a 4242 4242 4242 4242 b 5555555555554444 c";
    size_t n = card_data_mask(buf, strlen(buf));
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(buf, "a **** **** **** 4242 b ************4444 c");
    ck_assert(!found(buf));
    char next[] = "qty 2 4242424242424242 5555555555554444 1";
    ck_assert_uint_eq(card_data_mask(next, strlen(next)), 2);
    ck_assert_str_eq(next, "qty 2 ************4242 ************4444 1");
    /* The four digits kept of the first start a card with the groups after
     * it (found by fuzz_card_data): masked as well. */
    char chain[] = "x 224242424242442 1111 1111 1111 111 x";
    ck_assert_uint_ge(card_data_mask(chain, strlen(chain)), 2);
    ck_assert(!found(chain));
}
END_TEST

START_TEST(masking_leaves_other_bytes_alone)
{
    char buf[] = "order 12345 amount 100000000000";
    ck_assert_uint_eq(card_data_mask(buf, strlen(buf)), 0);
    ck_assert_str_eq(buf, "order 12345 amount 100000000000");
    ck_assert_uint_eq(card_data_mask(NULL, 0), 0);
}
END_TEST

/* Provider text enters charged through card_data_copy_masked: masked as
 * shown text is, on the whole text before the bound (a number cut by it
 * leaves no more than its cut digits unmasked), then bounded whole. */
START_TEST(provider_text_is_copied_masked)
{
    char out[64];
    ck_assert_uint_eq(card_data_copy_masked(out, sizeof(out), "4242424242424242"), 1);
    ck_assert_str_eq(out, "************4242");
    card_data_copy_masked(out, sizeof(out), "declined: 4000 0566 5566 5556");
    ck_assert_str_eq(out, "declined: **** **** **** 5556");
    card_data_copy_masked(out, sizeof(out), "x4000056655665556y");
    ck_assert_str_eq(out, "x************5556y"); /* the loose rule: track data */
    char small[10];
    card_data_copy_masked(small, sizeof(small), "4242424242424242");
    ck_assert_str_eq(small, "*********");
    card_data_copy_masked(out, sizeof(out), NULL);
    ck_assert_str_eq(out, "");
    card_data_copy_masked(out, sizeof(out), "insufficient_funds");
    ck_assert_str_eq(out, "insufficient_funds");
    /* Longer than the copy's stack buffer. */
    char big[2048];
    memset(big, 'a', sizeof(big));
    memcpy(big + 1500, " 4242424242424242", 17);
    big[sizeof(big) - 1] = '\0';
    char *all = malloc(sizeof(big));
    ck_assert_ptr_nonnull(all);
    ck_assert_uint_eq(card_data_copy_masked(all, sizeof(big), big), 1);
    ck_assert(!card_data_found(all, strlen(all)));
    free(all);
    /* No room at all: nothing written, and nothing kept (valgrind's run of
     * this suite finds the copy a long text once leaked here). */
    ck_assert_uint_eq(card_data_copy_masked(NULL, 0, big), 0);
}
END_TEST

/* The digits of a card split by anything a person reads past (issue 34,
 * adversary): other clients' metadata reached audit_findings.order_id as
 * "4242 4242 4242 4242" when the groups were split by a TAB or a
 * zero-width space, which the copy made spaces after the mask looked. */
static const char *const separators[] = {
    " ",            /* space */
    "  ",           /* two spaces */
    "\t",           /* TAB */
    "-",            /* hyphen */
    ".",            /* dot */
    "/",            /* slash */
    "_",            /* underscore */
    "\xc2\xa0",     /* NBSP */
    "\xe2\x80\x8b", /* zero-width space */
    "\xe2\x80\x8c", /* zero-width non-joiner */
    "\xe2\x81\xa0", /* word joiner */
    "\xef\xbb\xbf", /* BOM, zero-width no-break space */
    " - ",          /* a run of them */
    "\r\n",         /* a line break */
};

static void split(char *out, size_t size, const char *pan, const char *sep)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; pan[i]; i += 4)
        n += (size_t)snprintf(out + n, size - n, "%s%.4s", i ? sep : "", pan + i);
}

static int digits_of(const char *s, const char *pan)
{
    char flat[256];
    size_t n = 0;
    for (; *s && n + 1 < sizeof(flat); s++)
        if (*s >= '0' && *s <= '9')
            flat[n++] = *s;
    flat[n] = '\0';
    return strstr(flat, pan) != NULL;
}

START_TEST(provider_text_split_by_any_separator_is_masked)
{
    char in[256], out[256];
    for (size_t k = 0; k < sizeof(separators) / sizeof(separators[0]); k++) {
        split(in, sizeof(in), "4242424242424242", separators[k]);
        ck_assert_msg(card_data_copy_masked(out, sizeof(out), in) == 1,
                      "separator %zu: nothing masked in '%s'", k, out);
        ck_assert_msg(!digits_of(out, "4242424242424242") && digits_of(out, "4242"),
                      "separator %zu: '%s'", k, out);
        /* In running text, and as shown text masked in place. */
        char text[300];
        snprintf(text, sizeof(text), "order %s paid", in);
        ck_assert_uint_eq(card_data_mask_loose(text, strlen(text)), 1);
        ck_assert_msg(!digits_of(text, "4242424242424242"), "separator %zu: '%s'", k,
                      text);
    }
    /* Exactly as the adversary wrote it: the copy's spaces, the mask's stars. */
    card_data_copy_masked(out, sizeof(out), "4242\t4242\t4242\t4242");
    ck_assert_str_eq(out, "**** **** **** 4242");
    card_data_copy_masked(out, sizeof(out),
                          "4242\xe2\x80\x8b"
                          "4242\xe2\x80\x8b"
                          "4242\xe2\x80\x8b"
                          "4242");
    ck_assert_str_eq(out, "**** **** **** 4242");
    card_data_copy_masked(out, sizeof(out), "4242.4242.4242.4242");
    ck_assert_str_eq(out, "****.****.****.4242");
    card_data_copy_masked(out, sizeof(out), "4242*4242*4242*4242");
    ck_assert_str_eq(out, "***************4242");
    /* Any grouping: 5-5-5-1, 3-13, 1 by 1. */
    card_data_copy_masked(out, sizeof(out), "42424 24242 42424 2");
    ck_assert_str_eq(out, "***** ***** **424 2");
    ck_assert(!digits_of(out, "4242424242424242"));
    card_data_copy_masked(out, sizeof(out), "4 2 4 2 4 2 4 2 4 2 4 2 4 2 4 2");
    ck_assert_str_eq(out, "* * * * * * * * * * * * 4 2 4 2");
    /* Bounded after the mask: the cut number is masked all the same. */
    char small[12];
    card_data_copy_masked(small, sizeof(small), "4242\t4242\t4242\t4242");
    ck_assert_str_eq(small, "**** **** *");
}
END_TEST

START_TEST(shown_text_keeps_what_is_no_card)
{
    char out[256];
    /* UUIDs are ids, matched by the auditor: never masked, not even when
     * two of their groups make a Luhn-valid number of a card's length. */
    const char *ids[] = {"12345678-1234-1234-1234-424242424242",
                         "5D1C2C1E-4242-4242-4242-424242424242"};
    for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); k++) {
        ck_assert_uint_eq(card_data_copy_masked(out, sizeof(out), ids[k]), 0);
        ck_assert_str_eq(out, ids[k]);
    }
    ck_assert_uint_eq(
        card_data_copy_masked(out, sizeof(out),
                              "4242-424242424242 1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"),
        1);
    ck_assert_str_eq(out, "****-********4242 1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d");
    const char *plain[] = {"insufficient_funds",
                           "order 12345 amount 100000000000",
                           "4242 4242 4242 4241", /* fails Luhn */
                           "1732900000000",       /* ms timestamp */
                           "pi_3MtwBwLkdIwHu7ix28a3tqPa",
                           "card ending 4242, exp 12/30"};
    for (size_t k = 0; k < sizeof(plain) / sizeof(plain[0]); k++) {
        ck_assert_uint_eq(card_data_copy_masked(out, sizeof(out), plain[k]), 0);
        ck_assert_str_eq(out, plain[k]);
    }
    /* Twice over: the second pass finds nothing the first left. */
    char twice[] = "qty 2 4242 4242 4242 4242 / 5555.5555.5555.4444 x";
    ck_assert_uint_ge(card_data_mask_loose(twice, strlen(twice)), 2);
    ck_assert_uint_eq(card_data_mask_loose(twice, strlen(twice)), 0);
    ck_assert(!digits_of(twice, "4242424242424242") &&
              !digits_of(twice, "5555555555554444"));
}
END_TEST

/* "4242 1111 0004-4242 1111 0004-...": each card's kept four digits start the
 * next card (the hyphen before it makes it part of a token until the group
 * before is masked), so masking a pass at a time takes one pass per card:
 * quadratic, 2 s for 64 KiB and ~40 s for 256 KiB (webhook bodies go to
 * 10 MiB, dead letters mask whole messages). */
START_TEST(masks_a_chain_of_cards_in_linear_time)
{
    size_t len = 256 * 1024, n = 0;
    char *buf = malloc(len + 1);
    ck_assert_ptr_nonnull(buf);
    while (n + 15 <= len - 4)
        n += (size_t)snprintf(buf + n, 16, "4242 1111 0004-");
    memcpy(buf + n, "4242", 5);
    n += 4;
    ck_assert(found("4242 1111 0004-4242"));
    clock_t t0 = clock();
    size_t masked = card_data_mask(buf, n);
    double cpu = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ck_assert_uint_eq(masked, n / 15);
    ck_assert(!card_data_found(buf, n));
    ck_assert_msg(cpu < 1.0, "masking %zu bytes took %.2f s of CPU", n, cpu);
    free(buf);
}
END_TEST

/* The same for shown text, whose numbers any separator joins: a chain of
 * cards split by TABs, and digits one by one with long runs of
 * separators between (each group looks 19 digits ahead, no further). */
START_TEST(masks_shown_text_in_linear_time)
{
    size_t len = 256 * 1024, n = 0;
    char *buf = malloc(len + 1);
    ck_assert_ptr_nonnull(buf);
    while (n + 15 <= len - 4)
        n += (size_t)snprintf(buf + n, 16, "4242\t1111\t0004/");
    memcpy(buf + n, "4242", 5);
    n += 4;
    clock_t t0 = clock();
    ck_assert_uint_ge(card_data_mask_loose(buf, n), n / 15);
    for (size_t i = 0; i + 14 < n; i += 15)
        ck_assert_msg(buf[i] == '*', "byte %zu: '%.15s'", i, buf + i);
    for (size_t i = 0; i < len; i++)
        buf[i] = i % 64 == 0 ? (char)('2' + i / 64 % 5) : ' ';
    buf[len] = '\0';
    card_data_mask_loose(buf, len);
    double cpu = (double)(clock() - t0) / CLOCKS_PER_SEC;
    ck_assert_msg(cpu < 1.0, "masking twice %zu bytes took %.2f s of CPU", len, cpu);
    free(buf);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("card_data");
    TCase *tc = tcase_create("card_data");
    tcase_add_test(tc, finds_plain_and_grouped_card_numbers);
    tcase_add_test(tc, ignores_what_is_not_a_card);
    tcase_add_test(tc, masks_all_but_the_last_four_in_place);
    tcase_add_test(tc, masking_leaves_other_bytes_alone);
    tcase_add_test(tc, provider_text_is_copied_masked);
    tcase_add_test(tc, provider_text_split_by_any_separator_is_masked);
    tcase_add_test(tc, shown_text_keeps_what_is_no_card);
    suite_add_tcase(s, tc);
    TCase *slow = tcase_create("card_data_chain");
    tcase_set_timeout(slow, 120);
    tcase_add_test(slow, masks_a_chain_of_cards_in_linear_time);
    tcase_add_test(slow, masks_shown_text_in_linear_time);
    suite_add_tcase(s, slow);
    return test_env_run_suite(s);
}
