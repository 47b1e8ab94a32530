/* The void's rules in the auditor (op.h's audit, audit_policy.h's struct
 * audit_steps): an authorization of ours the provider canceled, by a
 * cancel our books must show as VOIDED, or by its expiry
 * (docs/auditor.md, "An authorization and its steps"). */
#include "void.h"

#include <string.h>

#include "charged_assert.h"

/* Its column of the step statement, over r, the attempt that recorded the
 * intent: whether a void of it is unsettled (void_attempts_attempt). */
enum { UNSETTLED, VOID_AUDIT_COLUMNS };

static const char *const void_audit_columns[VOID_AUDIT_COLUMNS] = {
    [UNSETTLED] =
        "(EXISTS (SELECT 1 FROM void_attempts v WHERE v.payment_attempt_id = r.id"
        "    AND v.status IN ('PENDING', 'PROCESSING', 'UNKNOWN')))::int",
};

/* Canceled at the provider by a cancel: our books must show it VOIDED. */
static struct audit_result void_booked(const struct audit_step_facts *f,
                                       const long long *cols, int ours)
{
    CHARGED_ASSERT(f && cols && ours);
    if (strcmp(f->status, "canceled") != 0)
        return audit_result_matched();
    if (!strcmp(f->cancellation_reason, "automatic") ||
        !strcmp(f->attempt_status, "VOIDED"))
        return audit_result_matched();
    if (audit_policy_step_grace(f->attempt_status, (int)cols[UNSETTLED]))
        return audit_result_pending("void not settled yet");
    return audit_result_finding(AUDIT_VOID_UNBOOKED, "canceled at the provider; the "
                                                     "attempt is not VOIDED");
}

/* Canceled by its expiry: a finding whatever our books say, the hold
 * stayed on the card until it lapsed. */
static struct audit_result lapsed(const struct audit_step_facts *f,
                                  const long long *cols, int ours)
{
    CHARGED_ASSERT(f && cols && ours);
    if (strcmp(f->status, "canceled") != 0 ||
        strcmp(f->cancellation_reason, "automatic") != 0)
        return audit_result_matched();
    return !strcmp(f->attempt_status, "VOIDED")
               ? audit_result_finding(AUDIT_AUTHORIZATION_EXPIRED_UNVOIDED,
                                      "authorization lapsed at the provider, never "
                                      "captured nor voided (VOIDED on its expiry)")
               : audit_result_finding(AUDIT_AUTHORIZATION_EXPIRED_UNVOIDED,
                                      "authorization lapsed at the provider, never "
                                      "captured nor voided");
}

static const struct audit_step_rule void_audit_rules[] = {
    {.judge = void_booked},
    {.judge = lapsed},
};

static const enum audit_kind void_audit_kinds[] = {
    AUDIT_VOID_UNBOOKED, AUDIT_AUTHORIZATION_EXPIRED_UNVOIDED};

const struct audit_steps void_audit = {
    .help = "void_unbooked and authorization_expired_unvoided",
    .kinds = void_audit_kinds,
    .nkinds = sizeof(void_audit_kinds) / sizeof(void_audit_kinds[0]),
    .of = "authorizations",
    .columns = void_audit_columns,
    .ncolumns = VOID_AUDIT_COLUMNS,
    .rules = void_audit_rules,
    .nrules = sizeof(void_audit_rules) / sizeof(void_audit_rules[0]),
};
