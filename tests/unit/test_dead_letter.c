/* Unit tests of common/kafka/dead_letter: the letter it builds for each reason,
 * as docs/dead-letters.md and the contract describe it. The original's
 * key, value and headers byte for byte, card numbers masked wherever they
 * are; the dlq.* headers; and the cut letter for a DLQ that refused the
 * whole one. */
#include <check.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "dead_letter.h"
#include "test_env.h"
#include "test_message.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"
#define CARD    "4242424242424242"
#define MASKED  "************4242"

static const struct dead_letter_origin origin = {
    .topic = "payments.charge.commands",
    .partition = 7,
    .offset = 123456789012LL,
    .timestamp_ms = 1700000000123LL,
    .consumer_group = "charged-worker",
    .worker = "worker-a",
};

/* docs/dead-letters.md's table, in the enum's order. */
static const char *const documented_codes[] = {
    "empty_value",          "oversized",
    "card_data_refused",    "invalid_utf8",
    "malformed_json",       "schema_violation",
    "key_mismatch",         "amount_over_limit",
    "currency_not_allowed", "idempotency_key_conflict",
    "database_refused",
};

/* The value of the last header called name, NUL-terminated in a static
 * buffer, or NULL. */
static const char *header(rd_kafka_headers_t *h, const char *name)
{
    static char buf[256];
    const void *v;
    size_t sz;
    if (rd_kafka_header_get_last(h, name, &v, &sz) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return NULL;
    ck_assert_uint_lt(sz, sizeof(buf));
    memcpy(buf, v, sz);
    buf[sz] = '\0';
    return buf;
}

static size_t header_count(rd_kafka_headers_t *h, const char *name)
{
    const void *v;
    size_t sz, n = 0;
    while (rd_kafka_header_get(h, n, name, &v, &sz) == RD_KAFKA_RESP_ERR_NO_ERROR)
        n++;
    return n;
}

static void sha256_hex(const void *p, size_t n, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    ck_assert(EVP_Digest(p, n, md, &len, EVP_sha256(), NULL));
    ck_assert_uint_eq(len, 32);
    for (unsigned i = 0; i < len; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

static test_message_t *message(const void *key, size_t key_len, const void *value,
                               size_t value_len,
                               const struct test_message_header *headers, size_t n)
{
    const struct test_message_spec spec = {key, key_len, value, value_len, headers, n};
    return test_message_new(&spec);
}

START_TEST(reason_codes_are_the_documented_ones)
{
    ck_assert_int_eq(sizeof(documented_codes) / sizeof(documented_codes[0]),
                     DEAD_LETTER__COUNT - 1);
    ck_assert_ptr_null(dead_letter_reason_name(DEAD_LETTER_NONE));
    ck_assert_ptr_null(dead_letter_reason_name(DEAD_LETTER__COUNT));
    for (int r = 1; r < DEAD_LETTER__COUNT; r++) {
        ck_assert_str_eq(dead_letter_reason_name(r), documented_codes[r - 1]);
        ck_assert_int_eq(dead_letter_reason_parse(documented_codes[r - 1]), r);
    }
    ck_assert_int_eq(dead_letter_reason_parse("Malformed_JSON"), -1);
    ck_assert_int_eq(dead_letter_reason_parse(""), -1);
    ck_assert_int_eq(dead_letter_reason_parse(NULL), -1);
}
END_TEST

/* Every reason: the original byte for byte (binary, NUL bytes, invalid
 * UTF-8 included), its headers in order, then the dlq.* headers. */
START_TEST(each_reason_builds_its_letter)
{
    static const char value[] = "{\"not\":\"json\"\0\xff\xfe tail";
    const struct test_message_header headers[] = {
        {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 55},
        {"bin", "a\0b\xff", 4},
        {"novalue", NULL, 0},
        {"bin", "second", 6},
        {"note", "card " CARD, 21},
    };
    test_message_t *m = message(ATTEMPT, 36, value, sizeof(value) - 1, headers, 5);
    enum dead_letter_reason r = (enum dead_letter_reason)_i;
    struct dead_letter dl;
    regex_t rfc3339;
    const char *name;
    const void *v;
    size_t sz;

    ck_assert_int_eq(
        dead_letter_build(test_message_get(m), r, "the line of why", &origin, 0, &dl),
        0);
    ck_assert_uint_eq(dl.key_len, 36);
    ck_assert_mem_eq(dl.key, ATTEMPT, 36);
    ck_assert_uint_eq(dl.value_len, sizeof(value) - 1);
    ck_assert_mem_eq(dl.value, value, sizeof(value) - 1);

    /* The original headers first, in their order, values as they were. */
    ck_assert_int_eq(rd_kafka_header_get_all(dl.headers, 0, &name, &v, &sz), 0);
    ck_assert_str_eq(name, "traceparent");
    ck_assert_uint_eq(sz, 55);
    ck_assert_int_eq(rd_kafka_header_get_all(dl.headers, 1, &name, &v, &sz), 0);
    ck_assert_str_eq(name, "bin");
    ck_assert_uint_eq(sz, 4);
    ck_assert_mem_eq(v, "a\0b\xff", 4);
    ck_assert_int_eq(rd_kafka_header_get_all(dl.headers, 2, &name, &v, &sz), 0);
    ck_assert_str_eq(name, "novalue");
    ck_assert_ptr_null(v);
    ck_assert_int_eq(rd_kafka_header_get_all(dl.headers, 3, &name, &v, &sz), 0);
    ck_assert_str_eq(name, "bin");
    ck_assert_mem_eq(v, "second", 6);
    /* Every letter is masked, whatever its reason. */
    ck_assert_int_eq(rd_kafka_header_get_all(dl.headers, 4, &name, &v, &sz), 0);
    ck_assert_str_eq(name, "note");
    ck_assert_uint_eq(sz, 21);
    ck_assert_mem_eq(v, "card " MASKED, 21);

    ck_assert_str_eq(header(dl.headers, "dlq.reason"), documented_codes[r - 1]);
    ck_assert_str_eq(header(dl.headers, "dlq.error"), "the line of why");
    ck_assert_str_eq(header(dl.headers, "dlq.original.topic"),
                     "payments.charge.commands");
    ck_assert_str_eq(header(dl.headers, "dlq.original.partition"), "7");
    ck_assert_str_eq(header(dl.headers, "dlq.original.offset"), "123456789012");
    ck_assert_str_eq(header(dl.headers, "dlq.original.timestamp"), "1700000000123");
    ck_assert_str_eq(header(dl.headers, "dlq.consumer.group"), "charged-worker");
    ck_assert_str_eq(header(dl.headers, "dlq.worker"), "worker-a");
    ck_assert_str_eq(header(dl.headers, "dlq.id"),
                     "payments.charge.commands:7:123456789012");
    /* RFC 3339, UTC, with milliseconds. */
    ck_assert_int_eq(regcomp(&rfc3339,
                             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                             "\\.[0-9]{3}Z$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    ck_assert_msg(regexec(&rfc3339, header(dl.headers, "dlq.failed_at"), 0, NULL, 0) ==
                      0,
                  "dlq.failed_at %s", header(dl.headers, "dlq.failed_at"));
    regfree(&rfc3339);
    /* Each once; an uncut letter says nothing was cut. */
    ck_assert_uint_eq(header_count(dl.headers, "dlq.reason"), 1);
    ck_assert_uint_eq(header_count(dl.headers, "dlq.id"), 1);
    ck_assert_ptr_null(header(dl.headers, "dlq.value.truncated"));
    ck_assert_ptr_null(header(dl.headers, "dlq.key.truncated"));
    ck_assert_ptr_null(header(dl.headers, "dlq.headers.dropped"));
    dead_letter_release(&dl);
    ck_assert_ptr_null(dl.headers);
    test_message_free(m);
}
END_TEST

/* No value, no key, no timestamp: what the letter says of each. */
START_TEST(what_is_missing_stays_missing)
{
    struct dead_letter_origin o = origin;
    struct dead_letter dl;
    test_message_t *m = message(NULL, 0, NULL, 0, NULL, 0);
    o.timestamp_ms = -1;
    ck_assert_int_eq(dead_letter_build(test_message_get(m), DEAD_LETTER_EMPTY_VALUE,
                                       "the message has no value", &o, 0, &dl),
                     0);
    ck_assert_ptr_null(dl.key);
    ck_assert_uint_eq(dl.key_len, 0);
    ck_assert_ptr_null(dl.value);
    ck_assert_uint_eq(dl.value_len, 0);
    ck_assert_str_eq(header(dl.headers, "dlq.reason"), "empty_value");
    ck_assert_str_eq(header(dl.headers, "dlq.original.timestamp"), "-1");
    dead_letter_release(&dl);
    /* An empty error is still a header. */
    ck_assert_int_eq(dead_letter_build(test_message_get(m), DEAD_LETTER_KEY_MISMATCH,
                                       NULL, &o, 0, &dl),
                     0);
    ck_assert_str_eq(header(dl.headers, "dlq.error"), "");
    dead_letter_release(&dl);
    test_message_free(m);
}
END_TEST

/* Card numbers are masked in the key, the value, every header and the
 * error line, whatever the reason, and all else is kept. */
START_TEST(card_numbers_are_masked_everywhere)
{
    static const char value[] =
        "{\"pan\":\"" CARD "\",\"grouped\":\"4242 4242 4242 4242\","
        "\"order_id\":\"" ATTEMPT "\",\"amount\":424242424242}";
    static const char masked[] =
        "{\"pan\":\"" MASKED "\",\"grouped\":\"**** **** **** 4242\","
        "\"order_id\":\"" ATTEMPT "\",\"amount\":424242424242}";
    const struct test_message_header headers[] = {{"note", "card " CARD, 21},
                                                  {"pan " CARD, "in the name", 11}};
    test_message_t *m = message("card " CARD, 21, value, sizeof(value) - 1, headers, 2);
    struct dead_letter dl;
    ck_assert_int_eq(dead_letter_build(test_message_get(m), DEAD_LETTER_OVERSIZED,
                                       "it said " CARD, &origin, 0, &dl),
                     0);
    ck_assert_uint_eq(dl.key_len, 21);
    ck_assert_mem_eq(dl.key, "card " MASKED, 21);
    ck_assert_uint_eq(dl.value_len, sizeof(masked) - 1);
    ck_assert_mem_eq(dl.value, masked, sizeof(masked) - 1);
    ck_assert_str_eq(header(dl.headers, "note"), "card " MASKED);
    /* "anywhere in them": a header's name too. */
    ck_assert_ptr_null(header(dl.headers, "pan " CARD));
    ck_assert_str_eq(header(dl.headers, "pan " MASKED), "in the name");
    ck_assert_str_eq(header(dl.headers, "dlq.error"), "it said " MASKED);
    ck_assert_str_eq(header(dl.headers, "dlq.reason"), "oversized");
    dead_letter_release(&dl);
    test_message_free(m);
}
END_TEST

/* A DLQ that refused the whole letter: the value to its first 64 KiB, the
 * key to its first 1 KiB, with headers saying what was cut. */
START_TEST(a_cut_letter_says_what_it_left_out)
{
    size_t vlen = 3 * DEAD_LETTER_CUT_VALUE + 5, klen = DEAD_LETTER_CUT_KEY + 9;
    char *value = malloc(vlen), *key = malloc(klen), *masked = malloc(vlen);
    char hex[65], num[32];
    struct dead_letter dl;
    for (size_t i = 0; i < vlen; i++)
        value[i] = (char)('a' + i % 26);
    memset(key, 'k', klen);
    /* A card number across the cut, and one beyond it. */
    memcpy(value + DEAD_LETTER_CUT_VALUE - 10, " " CARD " ", 18);
    memcpy(value + 2 * DEAD_LETTER_CUT_VALUE, " " CARD " ", 18);
    memcpy(masked, value, vlen);
    memcpy(masked + DEAD_LETTER_CUT_VALUE - 10, " " MASKED " ", 18);
    memcpy(masked + 2 * DEAD_LETTER_CUT_VALUE, " " MASKED " ", 18);
    const struct test_message_header headers[] = {{"small", "kept", 4}};
    test_message_t *m = message(key, klen, value, vlen, headers, 1);

    ck_assert_int_eq(dead_letter_build(test_message_get(m), DEAD_LETTER_OVERSIZED,
                                       "too large", &origin, 1, &dl),
                     0);
    ck_assert_uint_eq(dl.value_len, DEAD_LETTER_CUT_VALUE);
    ck_assert_int_eq(DEAD_LETTER_CUT_VALUE, 64 * 1024);
    ck_assert_mem_eq(dl.value, masked, DEAD_LETTER_CUT_VALUE);
    ck_assert_uint_eq(dl.key_len, DEAD_LETTER_CUT_KEY);
    ck_assert_int_eq(DEAD_LETTER_CUT_KEY, 1024);
    ck_assert_mem_eq(dl.key, key, DEAD_LETTER_CUT_KEY);
    ck_assert_str_eq(header(dl.headers, "dlq.value.truncated"), "true");
    snprintf(num, sizeof(num), "%zu", vlen);
    ck_assert_str_eq(header(dl.headers, "dlq.value.original_size"), num);
    /* Of the whole value, card digits masked: not the original's. */
    sha256_hex(masked, vlen, hex);
    ck_assert_str_eq(header(dl.headers, "dlq.value.sha256"), hex);
    sha256_hex(value, vlen, hex);
    ck_assert_str_ne(header(dl.headers, "dlq.value.sha256"), hex);
    ck_assert_str_eq(header(dl.headers, "dlq.key.truncated"), "true");
    snprintf(num, sizeof(num), "%zu", klen);
    ck_assert_str_eq(header(dl.headers, "dlq.key.original_size"), num);
    /* Small headers stay, and nothing says they were dropped. */
    ck_assert_str_eq(header(dl.headers, "small"), "kept");
    ck_assert_ptr_null(header(dl.headers, "dlq.headers.dropped"));
    ck_assert_str_eq(header(dl.headers, "dlq.reason"), "oversized");
    ck_assert_str_eq(header(dl.headers, "dlq.id"),
                     "payments.charge.commands:7:123456789012");
    dead_letter_release(&dl);
    test_message_free(m);
    free(value);
    free(key);
    free(masked);
}
END_TEST

/* Without card digits the hash is the original's own, and a letter that
 * fits is not cut even when asked to be. */
START_TEST(a_cut_letter_that_fits_is_whole)
{
    size_t vlen = DEAD_LETTER_CUT_VALUE + 1;
    char *value = malloc(vlen), hex[65];
    struct dead_letter dl;
    memset(value, 'v', vlen);
    test_message_t *m = message(ATTEMPT, 36, value, vlen, NULL, 0);
    ck_assert_int_eq(dead_letter_build(test_message_get(m), DEAD_LETTER_OVERSIZED, "x",
                                       &origin, 1, &dl),
                     0);
    sha256_hex(value, vlen, hex);
    ck_assert_str_eq(header(dl.headers, "dlq.value.sha256"), hex);
    ck_assert_ptr_null(header(dl.headers, "dlq.key.truncated"));
    ck_assert_mem_eq(dl.key, ATTEMPT, 36);
    dead_letter_release(&dl);
    test_message_free(m);

    m = message(ATTEMPT, 36, value, DEAD_LETTER_CUT_VALUE, NULL, 0);
    ck_assert_int_eq(dead_letter_build(test_message_get(m), DEAD_LETTER_OVERSIZED, "x",
                                       &origin, 1, &dl),
                     0);
    ck_assert_uint_eq(dl.value_len, DEAD_LETTER_CUT_VALUE);
    ck_assert_ptr_null(header(dl.headers, "dlq.value.truncated"));
    ck_assert_ptr_null(header(dl.headers, "dlq.value.sha256"));
    dead_letter_release(&dl);
    test_message_free(m);
    free(value);
}
END_TEST

/* Original headers together larger than 64 KiB are left out of a cut
 * letter, and it says how many; at 64 KiB exactly they stay. */
START_TEST(large_headers_are_dropped_from_a_cut_letter)
{
    static char big[DEAD_LETTER_CUT_HEADERS];
    struct test_message_header headers[3] = {
        {"a", big, 0}, {"b", "x", 1}, {"c", NULL, 0}};
    struct dead_letter dl;
    const char *name;
    const void *v;
    size_t sz;
    memset(big, 'h', sizeof(big));
    /* names and values: 1 + n + 1 + 1 + 1 = 64 KiB exactly */
    headers[0].size = DEAD_LETTER_CUT_HEADERS - 4;
    test_message_t *m = message(ATTEMPT, 36, "{}", 2, headers, 3);
    ck_assert_int_eq(dead_letter_build(test_message_get(m),
                                       DEAD_LETTER_SCHEMA_VIOLATION, "x", &origin, 1,
                                       &dl),
                     0);
    ck_assert_int_eq(rd_kafka_header_get_all(dl.headers, 0, &name, &v, &sz), 0);
    ck_assert_str_eq(name, "a");
    ck_assert_uint_eq(sz, DEAD_LETTER_CUT_HEADERS - 4);
    ck_assert_ptr_null(header(dl.headers, "dlq.headers.dropped"));
    dead_letter_release(&dl);
    test_message_free(m);

    headers[0].size++;
    m = message(ATTEMPT, 36, "{}", 2, headers, 3);
    ck_assert_int_eq(dead_letter_build(test_message_get(m),
                                       DEAD_LETTER_SCHEMA_VIOLATION, "x", &origin, 1,
                                       &dl),
                     0);
    ck_assert_uint_eq(header_count(dl.headers, "a"), 0);
    ck_assert_uint_eq(header_count(dl.headers, "b"), 0);
    ck_assert_uint_eq(header_count(dl.headers, "c"), 0);
    ck_assert_str_eq(header(dl.headers, "dlq.headers.dropped"), "3");
    ck_assert_str_eq(header(dl.headers, "dlq.reason"), "schema_violation");
    ck_assert_mem_eq(dl.value, "{}", 2);
    dead_letter_release(&dl);

    /* The same headers in a whole letter are all kept. */
    ck_assert_int_eq(dead_letter_build(test_message_get(m),
                                       DEAD_LETTER_SCHEMA_VIOLATION, "x", &origin, 0,
                                       &dl),
                     0);
    ck_assert_uint_eq(header_count(dl.headers, "a"), 1);
    ck_assert_uint_eq(header_count(dl.headers, "c"), 1);
    ck_assert_ptr_null(header(dl.headers, "dlq.headers.dropped"));
    dead_letter_release(&dl);
    test_message_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dead_letter");
    TCase *tc = tcase_create("dead_letter");
    tcase_add_test(tc, reason_codes_are_the_documented_ones);
    tcase_add_loop_test(tc, each_reason_builds_its_letter, 1, DEAD_LETTER__COUNT);
    tcase_add_test(tc, what_is_missing_stays_missing);
    tcase_add_test(tc, card_numbers_are_masked_everywhere);
    tcase_add_test(tc, a_cut_letter_says_what_it_left_out);
    tcase_add_test(tc, a_cut_letter_that_fits_is_whole);
    tcase_add_test(tc, large_headers_are_dropped_from_a_cut_letter);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
