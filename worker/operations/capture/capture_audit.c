/* The capture's rules in the auditor (op.h's audit, audit_policy.h's
 * struct audit_steps): what the provider took of an authorization of
 * ours against what our captures booked and asked (docs/auditor.md, "An
 * authorization and its steps"). */
#include "capture.h"

#include <string.h>

#include "charged_assert.h"

/* Its columns of the step statement, over r, the attempt that recorded
 * the intent: its captured_amount; a SUCCEEDED capture's; the most a
 * capture of it that reached the provider asked (NULL: all of the
 * attempt's); whether one is unsettled. Each an index probe
 * (capture_attempts_attempt). */
enum { CAPTURED, BOOKED, ASKED, UNSETTLED, CAPTURE_AUDIT_COLUMNS };

static const char *const capture_audit_columns[CAPTURE_AUDIT_COLUMNS] = {
    [CAPTURED] = "coalesce(r.captured_amount, -1)",
    [BOOKED] = "coalesce((SELECT c.captured_amount FROM capture_attempts c"
               "    WHERE c.payment_attempt_id = r.id AND c.status = 'SUCCEEDED' LIMIT "
               "1), -1)",
    [ASKED] =
        "coalesce((SELECT max(coalesce(c.amount, r.amount)) FROM capture_attempts c"
        "    WHERE c.payment_attempt_id = r.id AND c.status NOT IN ('PENDING', "
        "'REJECTED')), -1)",
    [UNSETTLED] =
        "(EXISTS (SELECT 1 FROM capture_attempts c WHERE c.payment_attempt_id = r.id"
        "    AND c.status IN ('PENDING', 'PROCESSING', 'UNKNOWN')))::int",
};

/* The provider took more than the intent held, than we authorized, or
 * than a capture of ours asked: final once captured (whoever's). */
static struct audit_result over_authorized(const struct audit_step_facts *f,
                                           const long long *cols, int ours)
{
    CHARGED_ASSERT(f && cols);
    if (f->amount_received <= 0)
        return audit_result_matched();
    if (f->amount_received > f->amount)
        return audit_result_finding(AUDIT_CAPTURED_OVER_AUTHORIZED,
                                    "captured more than the intent held");
    if (ours && f->amount_received > f->attempt_amount)
        return audit_result_finding(AUDIT_CAPTURED_OVER_AUTHORIZED,
                                    "captured more than we authorized");
    if (ours && cols[ASKED] >= 0 && f->amount_received > cols[ASKED])
        return audit_result_finding(AUDIT_CAPTURED_OVER_AUTHORIZED,
                                    "captured more than our capture asked");
    return audit_result_matched();
}

/* Ours: what we asked to take, all that we authorized when no capture
 * said. */
static long long over_authorized_books(const struct audit_step_facts *f,
                                       const long long *cols)
{
    CHARGED_ASSERT(f && cols);
    if (!*f->attempt_status)
        return -1;
    return cols[ASKED] >= 0 ? cols[ASKED] : f->attempt_amount;
}

/* Captured at the provider: booked when the attempt is SUCCEEDED with what
 * was received and a capture of ours SUCCEEDED with it too. */
static struct audit_result capture_booked(const struct audit_step_facts *f,
                                          const long long *cols, int ours)
{
    CHARGED_ASSERT(f && cols && ours);
    if (f->amount_received <= 0)
        return audit_result_matched();
    if (!strcmp(f->attempt_status, "SUCCEEDED") &&
        cols[CAPTURED] == f->amount_received && cols[BOOKED] == f->amount_received)
        return audit_result_matched();
    if (audit_policy_step_grace(f->attempt_status, (int)cols[UNSETTLED]))
        return audit_result_pending("capture not settled yet");
    return audit_result_finding(
        AUDIT_CAPTURE_UNBOOKED,
        !strcmp(f->attempt_status, "REQUIRES_REVIEW")
            ? "captured at the provider, unbooked while its attempt waits in "
              "review"
        : cols[BOOKED] < 0
            ? "captured at the provider; no capture of ours succeeded"
            : "captured at the provider for another amount than our books");
}

static long long capture_booked_books(const struct audit_step_facts *f,
                                      const long long *cols)
{
    CHARGED_ASSERT(f && cols);
    return *f->attempt_status ? cols[CAPTURED] : -1;
}

static const struct audit_step_rule capture_audit_rules[] = {
    {.any_owner = 1,
     .judge = over_authorized,
     .books = over_authorized_books,
     .money = 1,
     .error = 1},
    {.judge = capture_booked, .books = capture_booked_books, .money = 1, .error = 1},
};

static const enum audit_kind capture_audit_kinds[] = {AUDIT_CAPTURED_OVER_AUTHORIZED,
                                                      AUDIT_CAPTURE_UNBOOKED};

const struct audit_steps capture_audit = {
    .help = "of authorizations, captured_over_authorized, capture_unbooked,\n",
    .kinds = capture_audit_kinds,
    .nkinds = sizeof(capture_audit_kinds) / sizeof(capture_audit_kinds[0]),
    .of = "authorizations",
    .columns = capture_audit_columns,
    .ncolumns = CAPTURE_AUDIT_COLUMNS,
    .rules = capture_audit_rules,
    .nrules = sizeof(capture_audit_rules) / sizeof(capture_audit_rules[0]),
};
