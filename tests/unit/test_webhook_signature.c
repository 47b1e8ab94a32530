/* Unit tests of common/core/webhook_signature: authentic and fresh deliveries
 * pass; forged, tampered, stale, future and malformed ones do not; any of
 * several secrets and any of several v1 values may match (rotation). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "test_env.h"
#include "stripe.h"

#define T0 1700000000LL
static const char BODY[] = "{\"id\":\"evt_1\"}";
/* HMAC-SHA256("whsec_test_secret", "1700000000.{\"id\":\"evt_1\"}"), computed
 * outside this code base (Python's hmac). */
static const char KNOWN[] =
    "248a374f50f943a28b0f6ab50faf9a7e7e29b710fa26df9fb1618b9bf8ea9c9a";
static const char *const ONE[] = {"whsec_test_secret"};

static enum webhook_signature_rc verify(const char *header, int64_t now)
{
    return stripe_signature_verify(header, BODY, strlen(BODY), ONE, 1, now);
}

START_TEST(known_answer)
{
    char h[200], mine[200];
    snprintf(h, sizeof(h), "t=%lld,v1=%s", T0, KNOWN);
    ck_assert_int_eq(verify(h, T0), WEBHOOK_SIGNATURE_OK);
    ck_assert_int_eq(
        stripe_signature_sign(BODY, strlen(BODY), ONE[0], T0, mine, sizeof(mine)), 0);
    ck_assert_str_eq(mine, h);
    /* Upper-case hex is the same value. */
    char upper[200];
    snprintf(upper, sizeof(upper), "t=%lld,v1=", T0);
    for (const char *p = KNOWN; *p; p++) {
        size_t n = strlen(upper);
        upper[n] = (char)(*p >= 'a' && *p <= 'f' ? *p - 32 : *p);
        upper[n + 1] = '\0';
    }
    ck_assert_int_eq(verify(upper, T0), WEBHOOK_SIGNATURE_OK);
}
END_TEST

START_TEST(tolerance_both_ways)
{
    char h[200];
    stripe_signature_sign(BODY, strlen(BODY), ONE[0], T0, h, sizeof(h));
    ck_assert_int_eq(verify(h, T0 + WEBHOOK_SIGNATURE_TOLERANCE_S),
                     WEBHOOK_SIGNATURE_OK);
    ck_assert_int_eq(verify(h, T0 - WEBHOOK_SIGNATURE_TOLERANCE_S),
                     WEBHOOK_SIGNATURE_OK);
    ck_assert_int_eq(verify(h, T0 + WEBHOOK_SIGNATURE_TOLERANCE_S + 1),
                     WEBHOOK_SIGNATURE_STALE);
    ck_assert_int_eq(verify(h, T0 - WEBHOOK_SIGNATURE_TOLERANCE_S - 1),
                     WEBHOOK_SIGNATURE_FUTURE);
}
END_TEST

START_TEST(forged_and_tampered)
{
    char h[200];
    stripe_signature_sign(BODY, strlen(BODY), "whsec_someone_else", T0, h, sizeof(h));
    ck_assert_int_eq(verify(h, T0), WEBHOOK_SIGNATURE_MISMATCH);
    stripe_signature_sign(BODY, strlen(BODY), ONE[0], T0, h, sizeof(h));
    const char tampered[] = "{\"id\":\"evt_2\"}";
    ck_assert_int_eq(stripe_signature_verify(h, tampered, strlen(tampered), ONE, 1, T0),
                     WEBHOOK_SIGNATURE_MISMATCH);
    /* The timestamp is signed too: moving it breaks the signature. */
    char moved[200];
    snprintf(moved, sizeof(moved), "t=%lld,%s", T0 + 1, strchr(h, ',') + 1);
    ck_assert_int_eq(verify(moved, T0), WEBHOOK_SIGNATURE_MISMATCH);
    /* A body with a NUL inside is compared over all its bytes. */
    const char nul[] = "{\"id\":\"evt_1\"}\0x";
    ck_assert_int_eq(stripe_signature_verify(h, nul, sizeof(nul) - 1, ONE, 1, T0),
                     WEBHOOK_SIGNATURE_MISMATCH);
}
END_TEST

START_TEST(rotation)
{
    static const char *const both[] = {"whsec_new_secret", "whsec_old_secret"};
    char old[200], fresh[200], two[300], other[200];
    stripe_signature_sign(BODY, strlen(BODY), both[1], T0, old, sizeof(old));
    stripe_signature_sign(BODY, strlen(BODY), both[0], T0, fresh, sizeof(fresh));
    ck_assert_int_eq(stripe_signature_verify(old, BODY, strlen(BODY), both, 2, T0),
                     WEBHOOK_SIGNATURE_OK);
    ck_assert_int_eq(stripe_signature_verify(fresh, BODY, strlen(BODY), both, 2, T0),
                     WEBHOOK_SIGNATURE_OK);
    /* Only the new one configured: the old signature no longer passes. */
    ck_assert_int_eq(stripe_signature_verify(old, BODY, strlen(BODY), both, 1, T0),
                     WEBHOOK_SIGNATURE_MISMATCH);
    /* Two v1 values, the matching one second; and a v0 to skip. */
    stripe_signature_sign(BODY, strlen(BODY), "whsec_unrelated", T0, other,
                          sizeof(other));
    snprintf(two, sizeof(two), "%s,v0=abc,v1=%s", other, strstr(fresh, "v1=") + 3);
    ck_assert_int_eq(stripe_signature_verify(two, BODY, strlen(BODY), both, 1, T0),
                     WEBHOOK_SIGNATURE_OK);
}
END_TEST

START_TEST(malformed_headers)
{
    char h[200];
    stripe_signature_sign(BODY, strlen(BODY), ONE[0], T0, h, sizeof(h));
    const char *v1 = strstr(h, "v1=");
    char buf[2200];
    ck_assert_int_eq(verify(NULL, T0), WEBHOOK_SIGNATURE_MISSING);
    ck_assert_int_eq(verify("", T0), WEBHOOK_SIGNATURE_MISSING);
    ck_assert_int_eq(verify(v1, T0), WEBHOOK_SIGNATURE_MALFORMED); /* no t */
    ck_assert_int_eq(verify("t=1700000000", T0), WEBHOOK_SIGNATURE_MALFORMED);
    snprintf(buf, sizeof(buf), "t=-5,%s", v1);
    ck_assert_int_eq(verify(buf, T0), WEBHOOK_SIGNATURE_MALFORMED);
    snprintf(buf, sizeof(buf), "t=1700000000,t=1700000000,%s", v1);
    ck_assert_int_eq(verify(buf, T0), WEBHOOK_SIGNATURE_MALFORMED);
    snprintf(buf, sizeof(buf), "t=99999999999999999999,%s", v1);
    ck_assert_int_eq(verify(buf, T0), WEBHOOK_SIGNATURE_MALFORMED);
    snprintf(buf, sizeof(buf), "t=1700000000,v1=%.63s", v1 + 3); /* short */
    ck_assert_int_eq(verify(buf, T0), WEBHOOK_SIGNATURE_MALFORMED);
    snprintf(buf, sizeof(buf), "t=1700000000,v1=%.63sg", v1 + 3); /* not hex */
    ck_assert_int_eq(verify(buf, T0), WEBHOOK_SIGNATURE_MALFORMED);
    ck_assert_int_eq(verify("t=1700000000,garbage", T0), WEBHOOK_SIGNATURE_MALFORMED);
    /* Too many v1 values, or a huge header: refused before any HMAC. */
    strcpy(buf, "t=1700000000");
    for (int i = 0; i < 9; i++)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), ",%s", v1);
    ck_assert_int_eq(verify(buf, T0), WEBHOOK_SIGNATURE_MALFORMED);
    memset(buf, 'a', 2000);
    buf[2000] = '\0';
    ck_assert_int_eq(verify(buf, T0), WEBHOOK_SIGNATURE_MALFORMED);
    /* No secret configured: nothing matches. */
    ck_assert_int_eq(stripe_signature_verify(h, BODY, strlen(BODY), ONE, 0, T0),
                     WEBHOOK_SIGNATURE_MISMATCH);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("webhook_signature");
    TCase *tc = tcase_create("webhook_signature");
    tcase_add_test(tc, known_answer);
    tcase_add_test(tc, tolerance_both_ways);
    tcase_add_test(tc, forged_and_tampered);
    tcase_add_test(tc, rotation);
    tcase_add_test(tc, malformed_headers);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
