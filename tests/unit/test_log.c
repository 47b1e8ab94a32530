/* Unit tests of common/runtime/log: one JSON object per line on stderr, with ts,
 * level, program, msg and the fields (docs/interface.md), and registered
 * secrets replaced by "[redacted]" in every one of them
 * (docs/configuration.md), whatever the text around them: long, invalid
 * UTF-8, line breaks, quotes. */
#include <check.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "log.h"
#include "test_env.h"

#define SECRET "sk_live_0123456789abcdef"

static int saved_stderr = -1;
static FILE *captured;

static void capture_start(void)
{
    fflush(stderr);
    captured = tmpfile();
    ck_assert_ptr_nonnull(captured);
    saved_stderr = dup(STDERR_FILENO);
    ck_assert_int_ge(saved_stderr, 0);
    ck_assert_int_ge(dup2(fileno(captured), STDERR_FILENO), 0);
}

/* What was written to stderr since capture_start(), malloc'd. */
static char *capture_end(void)
{
    long n;
    char *text;
    fflush(stderr);
    ck_assert_int_ge(dup2(saved_stderr, STDERR_FILENO), 0);
    close(saved_stderr);
    n = ftell(captured);
    ck_assert_int_ge(n, 0);
    rewind(captured);
    text = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(text, 1, (size_t)n, captured), (size_t)n);
    text[n] = '\0';
    fclose(captured);
    return text;
}

/* The single line in text, as a JSON object: fails unless text is exactly
 * one line ending in '\n'. */
static json_t *only_line(const char *text)
{
    json_error_t jerr;
    size_t n = strlen(text);
    ck_assert_msg(n > 0 && text[n - 1] == '\n', "not a line: '%s'", text);
    ck_assert_msg(strchr(text, '\n') == text + n - 1, "more than one line: '%s'", text);
    ck_assert_msg(!strchr(text, '\r'), "a carriage return in '%s'", text);
    json_t *j = json_loadb(text, n - 1, JSON_REJECT_DUPLICATES, &jerr);
    ck_assert_msg(j != NULL, "not JSON (%s): '%s'", jerr.text, text);
    ck_assert(json_is_object(j));
    return j;
}

static const char *field(json_t *line, const char *name)
{
    return json_string_value(json_object_get(line, name));
}

static void setup(void)
{
    log_init("worker", LOG_DEBUG);
    log_clear_secrets();
}

static void teardown(void)
{
    log_clear_secrets();
}

START_TEST(a_line_is_one_json_object_with_its_fields)
{
    regex_t rfc3339;
    capture_start();
    log_info("attempt claimed", "payment_attempt_id", "a1", "order_id", "o1", NULL);
    char *text = capture_end();
    json_t *line = only_line(text);
    ck_assert_str_eq(field(line, "level"), "info");
    ck_assert_str_eq(field(line, "program"), "worker");
    ck_assert_str_eq(field(line, "msg"), "attempt claimed");
    ck_assert_str_eq(field(line, "payment_attempt_id"), "a1");
    ck_assert_str_eq(field(line, "order_id"), "o1");
    ck_assert_int_eq(json_object_size(line), 6);
    ck_assert_int_eq(regcomp(&rfc3339,
                             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                             "(\\.[0-9]+)?Z$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    ck_assert_msg(regexec(&rfc3339, field(line, "ts"), 0, NULL, 0) == 0, "ts %s",
                  field(line, "ts"));
    regfree(&rfc3339);
    json_decref(line);
    free(text);
}
END_TEST

START_TEST(a_null_value_is_left_out)
{
    capture_start();
    log_warn("m", "gone", (const char *)NULL, "kept", "yes", NULL);
    char *text = capture_end();
    json_t *line = only_line(text);
    ck_assert_ptr_null(json_object_get(line, "gone"));
    ck_assert_str_eq(field(line, "kept"), "yes");
    ck_assert_str_eq(field(line, "level"), "warn");
    json_decref(line);
    free(text);
}
END_TEST

START_TEST(levels_below_the_chosen_one_are_not_written)
{
    ck_assert_int_eq(log_level_parse("debug"), LOG_DEBUG);
    ck_assert_int_eq(log_level_parse("info"), LOG_INFO);
    ck_assert_int_eq(log_level_parse("warn"), LOG_WARN);
    ck_assert_int_eq(log_level_parse("error"), LOG_ERROR);
    ck_assert_int_eq(log_level_parse("INFO"), -1);
    ck_assert_int_eq(log_level_parse("warning"), -1);
    ck_assert_int_eq(log_level_parse(""), -1);
    ck_assert_int_eq(log_level_parse(NULL), -1);

    log_init("worker", LOG_WARN);
    capture_start();
    log_debug("no", NULL);
    log_info("no", NULL);
    log_warn("yes", NULL);
    log_error("yes too", NULL);
    char *text = capture_end();
    char *second = strchr(text, '\n') + 1;
    char *first = strndup(text, (size_t)(second - text));
    json_t *w = only_line(first);
    free(first);
    ck_assert_str_eq(field(w, "level"), "warn");
    json_t *e = only_line(second);
    ck_assert_str_eq(field(e, "level"), "error");
    ck_assert_str_eq(field(e, "msg"), "yes too");
    json_decref(w);
    json_decref(e);
    free(text);
}
END_TEST

/* A secret anywhere in the message or any value: replaced, every time it
 * occurs, and the text around it kept. */
START_TEST(a_secret_is_redacted_in_message_and_values)
{
    log_add_secret(SECRET);
    capture_start();
    log_error("calling with " SECRET, "error", SECRET " and again " SECRET, "url",
              "https://x/?key=" SECRET "&a=b", NULL);
    char *text = capture_end();
    ck_assert_ptr_null(strstr(text, SECRET));
    json_t *line = only_line(text);
    ck_assert_str_eq(field(line, "msg"), "calling with [redacted]");
    ck_assert_str_eq(field(line, "error"), "[redacted] and again [redacted]");
    ck_assert_str_eq(field(line, "url"), "https://x/?key=[redacted]&a=b");
    json_decref(line);
    free(text);

    char out[128];
    log_redact(SECRET SECRET, out, sizeof(out));
    ck_assert_str_eq(out, "[redacted][redacted]");
    log_redact("no secret here", out, sizeof(out));
    ck_assert_str_eq(out, "no secret here");
}
END_TEST

START_TEST(short_values_are_not_secrets_and_secrets_can_be_forgotten)
{
    char out[64];
    log_add_secret("abc"); /* shorter than 4 bytes: would garble every line */
    log_add_secret("");
    log_add_secret(NULL);
    log_redact("abcabc", out, sizeof(out));
    ck_assert_str_eq(out, "abcabc");
    log_add_secret("abcd");
    log_add_secret("abcd"); /* twice is once */
    log_redact("xabcdx", out, sizeof(out));
    ck_assert_str_eq(out, "x[redacted]x");
    log_clear_secrets();
    log_redact("xabcdx", out, sizeof(out));
    ck_assert_str_eq(out, "xabcdx");
}
END_TEST

/* A fleet can hold many keys (Kafka, database, provider, several signing
 * secrets): every one registered is redacted, none dropped past a count. */
START_TEST(every_secret_is_kept_however_many)
{
    char secret[32], line[64], out[64];
    for (int i = 0; i < 200; i++) {
        snprintf(secret, sizeof(secret), "secret-%03d-value", i);
        ck_assert_int_eq(log_add_secret(secret), 0);
    }
    for (int i = 0; i < 200; i++) {
        snprintf(line, sizeof(line), "<secret-%03d-value>", i);
        log_redact(line, out, sizeof(out));
        ck_assert_msg(!strcmp(out, "<[redacted]>"), "secret %d shown: %s", i, out);
    }
    log_clear_secrets();
}
END_TEST

/* One secret that begins with another, or two that overlap: no byte of
 * either reaches the line, whichever was registered first. */
START_TEST(overlapping_secrets_leave_nothing_of_either)
{
    char out[128];
    log_add_secret("hunter22");
    log_add_secret("hunter22-and-more");
    log_redact("[hunter22-and-more]", out, sizeof(out));
    ck_assert_str_eq(out, "[[redacted]]");
    log_clear_secrets();
    log_add_secret("pass1234");
    log_add_secret("1234word");
    log_redact("<pass1234word>", out, sizeof(out));
    ck_assert_str_eq(out, "<[redacted]>");
    log_redact("<1234word pass1234>", out, sizeof(out));
    ck_assert_str_eq(out, "<[redacted] [redacted]>");
}
END_TEST

/* A line break, a quote, a backslash or a control character in a value
 * stays inside its JSON string: the event is still one line, and reads
 * back as it was. */
START_TEST(line_breaks_and_quotes_stay_inside_the_value)
{
    static const char hostile[] =
        "a\nb\r\nc\"d\\e\x01\x1b[31mred\x7f\t\"}{\"level\":\"error";
    capture_start();
    log_info("two\nlines \"quoted\"", "error", hostile, "k\"ey", "v", NULL);
    char *text = capture_end();
    json_t *line = only_line(text);
    ck_assert_str_eq(field(line, "error"), hostile);
    ck_assert_str_eq(field(line, "msg"), "two\nlines \"quoted\"");
    ck_assert_str_eq(field(line, "level"), "info");
    ck_assert_str_eq(field(line, "k\"ey"), "v");
    ck_assert_ptr_null(strchr(text, '\x1b'));
    json_decref(line);
    free(text);
}
END_TEST

/* Bytes that are not UTF-8 never reach the line, and the line, the
 * message and the other fields survive them. */
START_TEST(invalid_utf8_never_breaks_a_line)
{
    capture_start();
    log_info("bad \xff\xfe byte", "error", "over\xc0\xafong", "surrogate",
             "\xed\xa0\x80", "kept", "caf\xc3\xa9", NULL);
    char *text = capture_end();
    json_t *line = only_line(text);
    ck_assert_ptr_null(strchr(text, '\xff'));
    ck_assert_ptr_null(strstr(text, "\xc0\xaf"));
    ck_assert_ptr_null(strstr(text, "\xed\xa0\x80"));
    ck_assert_ptr_nonnull(field(line, "msg"));
    ck_assert_ptr_nonnull(field(line, "error"));
    ck_assert_ptr_nonnull(field(line, "surrogate"));
    ck_assert_str_eq(field(line, "kept"), "caf\xc3\xa9");
    json_decref(line);
    free(text);
}
END_TEST

/* A value of 100 KB is still one line, and a secret in it is redacted
 * wherever it falls, at the end of what is kept included. */
START_TEST(a_long_value_is_one_line_without_its_secrets)
{
    size_t n = 100 * 1000;
    char *value = malloc(n + 1);
    log_add_secret(SECRET);
    for (size_t at = 2000; at < 2060; at += 3) {
        memset(value, 'v', n);
        value[n] = '\0';
        memcpy(value + at, SECRET, strlen(SECRET));
        memcpy(value + n - strlen(SECRET), SECRET, strlen(SECRET));
        capture_start();
        log_info("long", "value", value, "after", "kept", NULL);
        char *text = capture_end();
        json_t *line = only_line(text);
        const char *v = field(line, "value");
        ck_assert_ptr_nonnull(v);
        /* No part of the secret (its distinctive tail included). */
        ck_assert_ptr_null(strstr(text, "sk_live"));
        ck_assert_ptr_null(strstr(text, "89abcdef"));
        /* What is kept is the value's beginning. */
        size_t kept = strlen(v) < at ? strlen(v) : at;
        ck_assert_uint_gt(kept, 1000);
        ck_assert_int_eq(strncmp(v, value, kept), 0);
        ck_assert_str_eq(field(line, "after"), "kept");
        json_decref(line);
        free(text);
    }
    free(value);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, a_line_is_one_json_object_with_its_fields);
    tcase_add_test(tc, a_null_value_is_left_out);
    tcase_add_test(tc, levels_below_the_chosen_one_are_not_written);
    tcase_add_test(tc, a_secret_is_redacted_in_message_and_values);
    tcase_add_test(tc, short_values_are_not_secrets_and_secrets_can_be_forgotten);
    tcase_add_test(tc, every_secret_is_kept_however_many);
    tcase_add_test(tc, overlapping_secrets_leave_nothing_of_either);
    tcase_add_test(tc, line_breaks_and_quotes_stay_inside_the_value);
    tcase_add_test(tc, invalid_utf8_never_breaks_a_line);
    tcase_add_test(tc, a_long_value_is_one_line_without_its_secrets);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
