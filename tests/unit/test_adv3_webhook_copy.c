/* Adversary 3: the stored copy of a provider webhook (processed_webhook_events.
 * payload) against the seam's two claims (docs/api.md, stripe_event.c): card
 * numbers are masked in the stored copy, whoever wrote them, and the
 * provider's ids are kept as written under id keys outside metadata.
 *
 * Break 1: a card number written as a metadata KEY (metadata is anyone's to
 * write: psp-sim takes any metadata[...] key on a refund, Stripe any key on
 * any object) is stored whole. mask_card_numbers masks values only, and the
 * final card_data_mask on the dump cannot see a number next to a letter, in
 * groups of '.', or split by an escaped TAB or NBSP, which the value path
 * masks ("x4242424242424242" as a value is stored "x************4242").
 *
 * (Its break 2, an id "pi_4242424242424242" masked in the stored copy by the
 * final mask over the text, is not fixed yet: its case stays on the
 * attack's branch until it is.) */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stripe.h"
#include "test_env.h"
#include "webhook_event.h"

/* The copy's digits with every non-digit dropped: a card number stored in
 * any grouping shows as its 16 digits in a row. */
static int digits_hold(const char *s, const char *pan)
{
    char flat[8192];
    size_t n = 0;
    for (; *s && n + 1 < sizeof(flat); s++) {
        /* An escape's hex ("\u00a0", "\t") is no digit of the card. */
        if (s[0] == '\\' && s[1] == 'u') {
            s += 5;
            continue;
        }
        if (s[0] == '\\') {
            s += 1;
            continue;
        }
        if (*s >= '0' && *s <= '9')
            flat[n++] = *s;
        else if (*s != '.' && *s != ' ' && *s != '-')
            flat[n++] = '|'; /* a letter or quote ends the run */
    }
    flat[n] = '\0';
    return strstr(flat, pan) != NULL;
}

static char *stored(const char *body)
{
    struct webhook_event ev;
    struct charged_error err;
    char *norm = NULL;
    int rc = stripe_webhook_parse(body, strlen(body), &ev, &norm, &err);
    ck_assert_msg(rc == 0, "parse: %s", err.message);
    ck_assert_ptr_nonnull(norm);
    return norm;
}

static const char *const KEYS[] = {
    "x4242424242424242",         "4242.4242.4242.4242",
    "4242\\t4242\\t4242\\t4242", "4242\\u00a04242\\u00a04242\\u00a04242",
    "card:4242424242424242x",
};

START_TEST(card_number_in_a_metadata_key_is_masked)
{
    for (size_t i = 0; i < sizeof(KEYS) / sizeof(KEYS[0]); i++) {
        char intent[1024], refund[1024];
        snprintf(
            intent, sizeof(intent),
            "{\"id\":\"evt_k\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
            "\"data\":{\"object\":{\"id\":\"pi_k\",\"object\":\"payment_intent\","
            "\"status\":\"succeeded\",\"amount\":5,\"currency\":\"eur\","
            "\"metadata\":{\"%s\":\"v\"}}}}",
            KEYS[i]);
        snprintf(refund, sizeof(refund),
                 "{\"id\":\"evt_r\",\"type\":\"refund.created\",\"created\":1,"
                 "\"data\":{\"object\":{\"id\":\"re_k\",\"object\":\"refund\","
                 "\"status\":\"succeeded\",\"payment_intent\":\"pi_k\",\"amount\":5,"
                 "\"currency\":\"eur\",\"metadata\":{\"%s\":\"v\"}}}}",
                 KEYS[i]);
        const char *bodies[] = {intent, refund};
        for (int b = 0; b < 2; b++) {
            char *norm = stored(bodies[b]);
            ck_assert_msg(!digits_hold(norm, "4242424242424242"),
                          "key %s: the stored copy holds the card number: %s", KEYS[i],
                          norm);
            free(norm);
        }
    }
}
END_TEST

/* The same text as a metadata value is masked today: the key is the gap. */
START_TEST(card_number_in_a_metadata_value_is_masked)
{
    for (size_t i = 0; i < sizeof(KEYS) / sizeof(KEYS[0]); i++) {
        char body[1024];
        snprintf(
            body, sizeof(body),
            "{\"id\":\"evt_v\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
            "\"data\":{\"object\":{\"id\":\"pi_v\",\"object\":\"payment_intent\","
            "\"status\":\"succeeded\",\"amount\":5,\"currency\":\"eur\","
            "\"metadata\":{\"k\":\"%s\"}}}}",
            KEYS[i]);
        char *norm = stored(body);
        ck_assert_msg(!digits_hold(norm, "4242424242424242"), "value %s: %s", KEYS[i],
                      norm);
        free(norm);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("adv3_webhook_copy");
    TCase *tc = tcase_create("adv3_webhook_copy");
    tcase_add_test(tc, card_number_in_a_metadata_key_is_masked);
    tcase_add_test(tc, card_number_in_a_metadata_value_is_masked);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
