/* Unit tests of common/core/charge_command: each rule of the contract's command
 * schema, the deployment limits, and the fingerprint. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charge_command.h"
#include "test_env.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"
#define ORDER   "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0001"

static const struct charge_command_limits limits = {
    .max_bytes = 65536, .max_amount = 100000000000LL, .allowed_currencies = NULL};

static struct charged_error err;

/* A valid command with one member replaced ("" = as is; NULL value = removed). */
static char *command(const char *member, const char *value)
{
    const char *names[] = {"type",     "version",         "payment_attempt_id",
                           "order_id", "idempotency_key", "amount",
                           "currency", "payment_method"};
    const char *values[] = {
        "\"charge.requested\"",    "1",    "\"" ATTEMPT "\"", "\"" ORDER "\"",
        "\"attempt:" ATTEMPT "\"", "1999", "\"EUR\"",         "\"pm_card_visa\""};
    char *out = malloc(4096);
    size_t o = 0;
    int replaced = 0;
    o += (size_t)sprintf(out + o, "{");
    for (int i = 0; i < 8; i++) {
        const char *v = values[i];
        if (member && !strcmp(member, names[i])) {
            replaced = 1;
            if (!value)
                continue;
            v = value;
        }
        o += (size_t)sprintf(out + o, "%s\"%s\":%s", o > 1 ? "," : "", names[i], v);
    }
    if (member && !replaced && value)
        o += (size_t)sprintf(out + o, ",\"%s\":%s", member, value);
    sprintf(out + o, "}");
    return out;
}

static enum dead_letter_reason parse_with(const char *key, const char *value,
                                          const struct charge_command_limits *lim,
                                          struct charge_command *c)
{
    return charge_command_parse(key, key ? strlen(key) : 0, value,
                                value ? strlen(value) : 0, lim, c, &err);
}

static enum dead_letter_reason parse(const char *member, const char *value)
{
    struct charge_command c;
    char *v = command(member, value);
    enum dead_letter_reason r = parse_with(ATTEMPT, v, &limits, &c);
    if (r == DEAD_LETTER_NONE)
        charge_command_release(&c);
    free(v);
    return r;
}

START_TEST(valid_command_is_parsed)
{
    struct charge_command c;
    char *v = command("metadata", "{\"cart\":\"42\"}");
    ck_assert_int_eq(parse_with(ATTEMPT, v, &limits, &c), DEAD_LETTER_NONE);
    ck_assert_str_eq(c.payment_attempt_id, ATTEMPT);
    ck_assert_str_eq(c.order_id, ORDER);
    ck_assert_str_eq(c.idempotency_key, "attempt:" ATTEMPT);
    ck_assert_int_eq(c.amount, 1999);
    ck_assert_str_eq(c.currency, "EUR");
    ck_assert_str_eq(c.payment_method, "pm_card_visa");
    ck_assert_str_eq(c.customer_id, "");
    ck_assert_str_eq(c.metadata_json, "{\"cart\":\"42\"}");
    ck_assert_uint_eq(strlen(c.fingerprint), 64);
    charge_command_release(&c);
    free(v);
}
END_TEST

START_TEST(unknown_fields_are_ignored)
{
    ck_assert_int_eq(parse("shipping_hint", "\"fast\""), DEAD_LETTER_NONE);
}
END_TEST

static const struct {
    const char *member, *value;
    enum dead_letter_reason reason;
} rules[] = {
    {"type", "\"charge.refunded\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"version", "2", DEAD_LETTER_SCHEMA_VIOLATION},
    {"version", "\"1\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"payment_attempt_id", "\"not-a-uuid-at-all-but-36-characters\"",
     DEAD_LETTER_SCHEMA_VIOLATION},
    {"order_id", NULL, DEAD_LETTER_SCHEMA_VIOLATION},
    {"order_id", "42", DEAD_LETTER_SCHEMA_VIOLATION},
    {"idempotency_key", "\"\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"idempotency_key", "\"has space\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"amount", "0", DEAD_LETTER_SCHEMA_VIOLATION},
    {"amount", "-1", DEAD_LETTER_SCHEMA_VIOLATION},
    {"amount", "100000000001", DEAD_LETTER_SCHEMA_VIOLATION},
    {"amount", "19.99", DEAD_LETTER_SCHEMA_VIOLATION},
    {"amount", "\"1999\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"currency", "\"eur\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"currency", "\"EURO\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"currency", "\"XYZ\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"payment_method", "\"\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"payment_method", NULL, DEAD_LETTER_SCHEMA_VIOLATION},
    {"customer_id", "\"\"", DEAD_LETTER_SCHEMA_VIOLATION},
    {"metadata", "[]", DEAD_LETTER_SCHEMA_VIOLATION},
    {"metadata", "{\"a\":1}", DEAD_LETTER_SCHEMA_VIOLATION},
    {"payment_method", "\"4242424242424242\"", DEAD_LETTER_CARD_DATA},
};

START_TEST(each_rule_has_its_reason)
{
    enum dead_letter_reason r = parse(rules[_i].member, rules[_i].value);
    ck_assert_msg(r == rules[_i].reason, "%s=%s: got %s (%s)", rules[_i].member,
                  rules[_i].value ? rules[_i].value : "(removed)",
                  dead_letter_reason_name(r), err.message);
    ck_assert_msg(!strstr(err.message, "4242424242424242"), "card digits in error: %s",
                  err.message);
}
END_TEST

START_TEST(idempotency_key_of_128_is_fine_129_is_not)
{
    char v[200];
    memset(v, 'k', sizeof(v));
    v[0] = '"';
    v[129] = '"';
    v[130] = '\0';
    ck_assert_int_eq(parse("idempotency_key", v), DEAD_LETTER_NONE);
    v[129] = 'k';
    v[130] = '"';
    v[131] = '\0';
    ck_assert_int_eq(parse("idempotency_key", v), DEAD_LETTER_SCHEMA_VIOLATION);
}
END_TEST

/* n copies of the UTF-8 character ch, as a JSON string (quotes included). */
static char *repeated(const char *ch, size_t n)
{
    char *s = malloc(n * strlen(ch) + 3);
    size_t o = 0;
    s[o++] = '"';
    for (size_t i = 0; i < n; i++, o += strlen(ch))
        memcpy(s + o, ch, strlen(ch));
    s[o++] = '"';
    s[o] = '\0';
    return s;
}

/* The contract bounds these in characters, as JSON Schema's maxLength
 * counts them (code points), not in bytes: 255 characters of 2 or 4 bytes
 * each are a valid token, 256 are not. */
static const char *const wide[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x92\xb3"};

START_TEST(text_of_255_multibyte_characters_is_fine_256_is_not)
{
    const char *fields[] = {"payment_method", "customer_id"};
    for (size_t f = 0; f < 2; f++) {
        struct charge_command c;
        char *ok = repeated(wide[_i], 255), *over = repeated(wide[_i], 256);
        char *v = command(fields[f], ok);
        enum dead_letter_reason r = parse_with(ATTEMPT, v, &limits, &c);
        ck_assert_msg(r == DEAD_LETTER_NONE, "%s of 255 x %zu-byte characters: %s (%s)",
                      fields[f], strlen(wide[_i]), dead_letter_reason_name(r),
                      err.message);
        /* Kept whole, byte for byte: it is what the provider is sent. */
        const char *got = f ? c.customer_id : c.payment_method;
        ck_assert_uint_eq(strlen(got), 255 * strlen(wide[_i]));
        ck_assert_int_eq(strncmp(got, ok + 1, strlen(got)), 0);
        charge_command_release(&c);
        free(v);
        v = command(fields[f], over);
        ck_assert_int_eq(parse_with(ATTEMPT, v, &limits, &c),
                         DEAD_LETTER_SCHEMA_VIOLATION);
        ck_assert_msg(strstr(err.message, fields[f]) &&
                          strstr(err.message, "characters"),
                      "%s", err.message);
        free(v);
        free(ok);
        free(over);
    }
}
END_TEST

START_TEST(metadata_is_bounded_in_characters)
{
    char md[4096];
    char *k40 = repeated(wide[_i], 40), *k41 = repeated(wide[_i], 41);
    char *v500 = repeated(wide[_i], 500), *v501 = repeated(wide[_i], 501);
    snprintf(md, sizeof(md), "{%s:%s}", k40, v500);
    ck_assert_msg(parse("metadata", md) == DEAD_LETTER_NONE, "40/500 x %zu bytes: %s",
                  strlen(wide[_i]), err.message);
    snprintf(md, sizeof(md), "{%s:\"v\"}", k41);
    ck_assert_int_eq(parse("metadata", md), DEAD_LETTER_SCHEMA_VIOLATION);
    snprintf(md, sizeof(md), "{\"k\":%s}", v501);
    ck_assert_int_eq(parse("metadata", md), DEAD_LETTER_SCHEMA_VIOLATION);
    free(k40);
    free(k41);
    free(v500);
    free(v501);
}
END_TEST

START_TEST(twenty_one_metadata_pairs_are_too_many)
{
    char md[1024] = "{";
    for (int i = 0; i < 21; i++)
        sprintf(md + strlen(md), "%s\"k%d\":\"v\"", i ? "," : "", i);
    strcat(md, "}");
    ck_assert_int_eq(parse("metadata", md), DEAD_LETTER_SCHEMA_VIOLATION);
}
END_TEST

START_TEST(envelope_problems)
{
    struct charge_command c;
    char *v = command(NULL, NULL);
    ck_assert_int_eq(parse_with(ATTEMPT, "", &limits, &c), DEAD_LETTER_EMPTY_VALUE);
    ck_assert_int_eq(parse_with(ATTEMPT, NULL, &limits, &c), DEAD_LETTER_EMPTY_VALUE);
    ck_assert_int_eq(parse_with(ATTEMPT, "{\"type\":", &limits, &c),
                     DEAD_LETTER_MALFORMED_JSON);
    ck_assert_int_eq(parse_with(ATTEMPT, "[1,2]", &limits, &c),
                     DEAD_LETTER_SCHEMA_VIOLATION);
    ck_assert_int_eq(parse_with(ATTEMPT, "{\"a\":\"\xc3\x28\"}", &limits, &c),
                     DEAD_LETTER_INVALID_UTF8);
    ck_assert_int_eq(parse_with(NULL, v, &limits, &c), DEAD_LETTER_KEY_MISMATCH);
    ck_assert_int_eq(parse_with("5d1c2c1e-1a9b-4b1e-8e55-000000000002", v, &limits, &c),
                     DEAD_LETTER_KEY_MISMATCH);
    struct charge_command_limits small = limits;
    small.max_bytes = 64;
    ck_assert_int_eq(parse_with(ATTEMPT, v, &small, &c), DEAD_LETTER_OVERSIZED);
    free(v);
}
END_TEST

START_TEST(deployment_limits)
{
    struct charge_command c;
    char *v = command(NULL, NULL);
    struct charge_command_limits lim = limits;
    lim.max_amount = 1000;
    ck_assert_int_eq(parse_with(ATTEMPT, v, &lim, &c), DEAD_LETTER_AMOUNT_OVER_LIMIT);
    lim.max_amount = 1999;
    lim.allowed_currencies = "USD, GBP";
    ck_assert_int_eq(parse_with(ATTEMPT, v, &lim, &c),
                     DEAD_LETTER_CURRENCY_NOT_ALLOWED);
    lim.allowed_currencies = "USD,EUR";
    ck_assert_int_eq(parse_with(ATTEMPT, v, &lim, &c), DEAD_LETTER_NONE);
    charge_command_release(&c);
    free(v);
}
END_TEST

START_TEST(fingerprint_follows_what_is_charged)
{
    struct charge_command a, b;
    char *v1 = command(NULL, NULL), *v2 = command("amount", "2000"),
         *v3 = command("metadata", "{\"x\":\"y\"}");
    ck_assert_int_eq(parse_with(ATTEMPT, v1, &limits, &a), DEAD_LETTER_NONE);
    ck_assert_int_eq(parse_with(ATTEMPT, v2, &limits, &b), DEAD_LETTER_NONE);
    ck_assert_str_ne(a.fingerprint, b.fingerprint);
    charge_command_release(&b);
    ck_assert_int_eq(parse_with(ATTEMPT, v3, &limits, &b), DEAD_LETTER_NONE);
    ck_assert_str_eq(a.fingerprint, b.fingerprint); /* metadata is not charged */
    charge_command_release(&a);
    charge_command_release(&b);
    free(v1);
    free(v2);
    free(v3);
}
END_TEST

/* An authorization.requested is a charge's fields under its own type:
 * parsed by the same rules, marked manual, and fingerprinted apart from a
 * charge of the same parameters (one attempt is never both); each parser
 * refuses the other's type. A charge's fingerprint is what it was before
 * authorizations existed. */
START_TEST(authorization_is_a_charge_held)
{
    struct charge_command a, c;
    char *charge = command(NULL, NULL),
         *auth = command("type", "\"authorization.requested\"");
    ck_assert_int_eq(charge_command_parse_as("authorization.requested", 1, ATTEMPT,
                                             strlen(ATTEMPT), auth, strlen(auth),
                                             &limits, &a, &err),
                     DEAD_LETTER_NONE);
    ck_assert_int_eq(a.manual, 1);
    ck_assert_int_eq(a.amount, 1999);
    ck_assert_int_eq(parse_with(ATTEMPT, charge, &limits, &c), DEAD_LETTER_NONE);
    ck_assert_int_eq(c.manual, 0);
    ck_assert_str_ne(a.fingerprint, c.fingerprint);
    /* SHA-256 of the six length-prefixed fields, as stored since 0001. */
    ck_assert_str_eq(
        c.fingerprint,
        "310783469464b391180bde2b205b086bda3e86e1be8fddd560e768fc62166b0a");
    charge_command_release(&a);
    charge_command_release(&c);
    ck_assert_int_eq(parse_with(ATTEMPT, auth, &limits, &c),
                     DEAD_LETTER_SCHEMA_VIOLATION);
    ck_assert_int_eq(charge_command_parse_as("authorization.requested", 1, ATTEMPT,
                                             strlen(ATTEMPT), charge, strlen(charge),
                                             &limits, &a, &err),
                     DEAD_LETTER_SCHEMA_VIOLATION);
    free(charge);
    free(auth);
}
END_TEST

/* Fields are length-prefixed: a separator inside a value cannot make two
 * different commands share a fingerprint. */
START_TEST(fingerprint_is_unambiguous)
{
    struct charge_command a, b;
    char *v1 = command("payment_method", "\"pm_a|b\"");
    char *v2 = command("payment_method", "\"pm_a\"");
    char *v2c = malloc(strlen(v2) + 64);
    /* The same bytes joined by '|': "pm_a|b" + "" against "pm_a" + "b|". */
    sprintf(v2c, "%.*s,\"customer_id\":\"b|\"}", (int)strlen(v2) - 1, v2);
    ck_assert_int_eq(parse_with(ATTEMPT, v1, &limits, &a), DEAD_LETTER_NONE);
    ck_assert_int_eq(parse_with(ATTEMPT, v2c, &limits, &b), DEAD_LETTER_NONE);
    ck_assert_str_ne(a.fingerprint, b.fingerprint);
    charge_command_release(&a);
    charge_command_release(&b);
    free(v1);
    free(v2);
    free(v2c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("charge_command");
    TCase *tc = tcase_create("charge_command");
    tcase_add_test(tc, valid_command_is_parsed);
    tcase_add_test(tc, unknown_fields_are_ignored);
    tcase_add_loop_test(tc, each_rule_has_its_reason, 0,
                        sizeof(rules) / sizeof(rules[0]));
    tcase_add_test(tc, idempotency_key_of_128_is_fine_129_is_not);
    tcase_add_loop_test(tc, text_of_255_multibyte_characters_is_fine_256_is_not, 0,
                        sizeof(wide) / sizeof(wide[0]));
    tcase_add_loop_test(tc, metadata_is_bounded_in_characters, 0,
                        sizeof(wide) / sizeof(wide[0]));
    tcase_add_test(tc, twenty_one_metadata_pairs_are_too_many);
    tcase_add_test(tc, envelope_problems);
    tcase_add_test(tc, deployment_limits);
    tcase_add_test(tc, fingerprint_follows_what_is_charged);
    tcase_add_test(tc, fingerprint_is_unambiguous);
    tcase_add_test(tc, authorization_is_a_charge_held);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
