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

int main(void)
{
    Suite *s = suite_create("card_data");
    TCase *tc = tcase_create("card_data");
    tcase_add_test(tc, finds_plain_and_grouped_card_numbers);
    tcase_add_test(tc, ignores_what_is_not_a_card);
    tcase_add_test(tc, masks_all_but_the_last_four_in_place);
    tcase_add_test(tc, masking_leaves_other_bytes_alone);
    tcase_add_test(tc, provider_text_is_copied_masked);
    suite_add_tcase(s, tc);
    TCase *slow = tcase_create("card_data_chain");
    tcase_set_timeout(slow, 120);
    tcase_add_test(slow, masks_a_chain_of_cards_in_linear_time);
    suite_add_tcase(s, slow);
    return test_env_run_suite(s);
}
