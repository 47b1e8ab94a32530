/* Unit tests of the operations' audit rules (audit_policy_steps over the
 * table's struct audit_steps: the capture's and the void's): docs/auditor.md's
 * "An authorization and its steps", one row per rule it states. The
 * expectations are written out here from the documentation, not computed
 * from the modules. */
#include <check.h>
#include <string.h>

#include "audit_policy.h"
#include "op.h"
#include "test_env.h"

/* An authorization's steps (docs/auditor.md, "An authorization and its
 * steps"): each rule's expectations, written out from the table. An
 * authorization of 1000 at the provider; att: the status of the attempt
 * that recorded it ("" none), amt what it authorized, capd its
 * captured_amount, booked a SUCCEEDED capture's, asked what a capture of
 * ours sent asked (-1: none), cu and vu whether a capture or a void of it
 * is unsettled: the capture's columns, then the void's (the table's
 * order, capture_audit.c and void_audit.c; the_table checks it). */
#define AUTH(st, recv, reason, att, amt, capd, booked, asked, cu, vu)                  \
    .manual = 1, .status = st, .amount = 1000, .amount_received = recv,                \
    .cancellation_reason = reason, .attempt_status = att, .attempt_amount = amt,       \
    .columns = {capd, booked, asked, cu, vu}
#define HELD(st, recv, reason, att) AUTH(st, recv, reason, att, 1000, -1, -1, -1, 0, 0)

struct step_row {
    const char *name;
    struct audit_step_facts f;
    int pending;                                 /* audit_policy_steps' answer */
    enum audit_kind kinds[AUDIT_STEP_RULES_MAX]; /* the findings, 0-terminated */
};

static const struct step_row steps[] = {
    {"automatic: none of these rules",
     {.manual = 0,
      .status = "succeeded",
      .amount = 1000,
      .amount_received = 1000,
      .cancellation_reason = "",
      .attempt_status = "SUCCEEDED"},
     0,
     {0}},
    {"held, ours: looked at again until it settles",
     {HELD("requires_capture", 0, "", "AUTHORIZED")},
     1,
     {0}},
    {"captured as booked",
     {AUTH("succeeded", 600, "", "SUCCEEDED", 1000, 600, 600, 600, 0, 0)},
     0,
     {0}},
    {"captured, our capture in flight: grace",
     {AUTH("succeeded", 600, "", "AUTHORIZED", 1000, -1, -1, 600, 1, 0)},
     1,
     {0}},
    {"captured, no capture of ours",
     {HELD("succeeded", 600, "", "AUTHORIZED")},
     0,
     {AUDIT_CAPTURE_UNBOOKED, 0}},
    {"captured, attempt in review: not waited for",
     {HELD("succeeded", 600, "", "REQUIRES_REVIEW")},
     0,
     {AUDIT_CAPTURE_UNBOOKED, 0}},
    {"captured, our books another amount",
     {AUTH("succeeded", 600, "", "SUCCEEDED", 1000, 500, 500, 500, 0, 0)},
     0,
     {AUDIT_CAPTURED_OVER_AUTHORIZED, AUDIT_CAPTURE_UNBOOKED, 0}},
    {"captured more than our capture asked, in flight",
     {AUTH("succeeded", 800, "", "AUTHORIZED", 1000, -1, -1, 500, 1, 0)},
     1,
     {AUDIT_CAPTURED_OVER_AUTHORIZED, 0}},
    {"captured more than the intent held",
     {AUTH("succeeded", 1200, "", "SUCCEEDED", 1200, 1200, 1200, -1, 0, 0)},
     0,
     {AUDIT_CAPTURED_OVER_AUTHORIZED, 0}},
    {"captured more than we authorized",
     {AUTH("succeeded", 900, "", "SUCCEEDED", 800, 900, 900, -1, 0, 0)},
     0,
     {AUDIT_CAPTURED_OVER_AUTHORIZED, 0}},
    {"voided as booked", {HELD("canceled", 0, "abandoned", "VOIDED")}, 0, {0}},
    {"canceled, no reason given, not VOIDED",
     {HELD("canceled", 0, "", "AUTHORIZED")},
     0,
     {AUDIT_VOID_UNBOOKED, 0}},
    {"canceled, our void in flight: grace",
     {AUTH("canceled", 0, "requested_by_customer", "AUTHORIZED", 1000, -1, -1, -1, 0,
           1)},
     1,
     {0}},
    {"canceled, attempt UNKNOWN: grace",
     {HELD("canceled", 0, "duplicate", "UNKNOWN")},
     1,
     {0}},
    {"lapsed, VOIDED (expired): still a finding",
     {HELD("canceled", 0, "automatic", "VOIDED")},
     0,
     {AUDIT_AUTHORIZATION_EXPIRED_UNVOIDED, 0}},
    {"lapsed, not VOIDED: the expiry finding, not a void's",
     {HELD("canceled", 0, "automatic", "AUTHORIZED")},
     0,
     {AUDIT_AUTHORIZATION_EXPIRED_UNVOIDED, 0}},
    {"not ours: none (the money rules judge it)",
     {HELD("canceled", 0, "automatic", "")},
     0,
     {0}},
    {"not recorded yet, its named attempt unsettled: grace",
     {HELD("canceled", 0, "automatic", ""), .named_unsettled = 1},
     1,
     {0}},
    {"not ours, captured more than it held: whoever's",
     {HELD("succeeded", 1001, "", "")},
     0,
     {AUDIT_CAPTURED_OVER_AUTHORIZED, 0}},
};

START_TEST(each_step_rule)
{
    const struct step_row *row = &steps[_i];
    struct audit_result out[AUDIT_STEP_RULES_MAX];
    struct audit_step_table t;
    size_t want = 0, got = 0, n = 0;
    payment_ops_audit_steps(&t);
    ck_assert_msg(audit_policy_steps(&row->f, &t, out, &n) == row->pending,
                  "%s: pending", row->name);
    while (want < AUDIT_STEP_RULES_MAX && row->kinds[want])
        want++;
    for (size_t r = 0; r < n; r++) {
        if (out[r].outcome != AUDIT_FINDING)
            continue;
        ck_assert_msg(got < want && out[r].kind == row->kinds[got], "%s: finding %s",
                      row->name, audit_kind_name(out[r].kind));
        ck_assert_msg(out[r].detail && *out[r].detail, "%s: a detail", row->name);
        got++;
    }
    ck_assert_msg(got == want, "%s: %zu findings, want %zu", row->name, got, want);
}
END_TEST

/* The rows' columns are the capture's four, then the void's one: the
 * table's operations with rules, in its order. */
START_TEST(the_table)
{
    struct audit_step_table t;
    payment_ops_audit_steps(&t);
    ck_assert_uint_eq(t.n, 2);
    ck_assert_uint_eq(t.sets[0]->ncolumns, 4);
    ck_assert_uint_eq(t.sets[0]->nrules, 2);
    ck_assert_uint_eq(t.sets[1]->ncolumns, 1);
    ck_assert_uint_eq(t.sets[1]->nrules, 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("audit_steps");
    TCase *tc = tcase_create("audit_steps");
    tcase_add_test(tc, the_table);
    tcase_add_loop_test(tc, each_step_rule, 0, sizeof(steps) / sizeof(steps[0]));
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
