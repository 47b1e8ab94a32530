#include "refund_review.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "charged_assert.h"
#include "db.h"
#include "ownership.h"
#include "refund_sql.h"

/* clang-format off */
/* Also: whether a lease on it is live, the age of its key since the last
 * call under it (NULL: never sent), its charge's intent, and whether $2
 * answered its own refund call (under its key). Both times are the
 * database's: a call's started_at is its host's clock, so the call counts
 * from when the database recorded it (recorded_at, after the call; rows
 * older than migration 0014 have only started_at). */
static const char *SQL_LOCK =
    "SELECT status, reserved, amount, payment_attempt_id, coalesce(provider_refund_id, ''),"
    "  EXISTS (SELECT 1 FROM refund_attempts o WHERE o.provider_refund_id = $2"
    "    AND o.id <> r.id),"
    "  coalesce(lease_expires_at > now(), false),"
    "  (extract(epoch FROM now() - greatest(first_sent_at,"
    "    (SELECT max(coalesce(c.recorded_at, c.started_at)) FROM provider_calls c"
    "     WHERE c.refund_id = r.id))) * 1000)::bigint,"
    "  coalesce(r.payment_intent, (SELECT p.provider_payment_id FROM payment_attempts p"
    "    WHERE p.id = r.payment_attempt_id), ''),"
    "  EXISTS (SELECT 1 FROM provider_calls c WHERE c.refund_id = r.id"
    "    AND c.operation = 'refund' AND c.provider_payment_id = $2)"
    " FROM refund_attempts r WHERE id = $1::uuid FOR NO KEY UPDATE";

/* The reservation a SUCCEEDED decision needs, within what the charge took
 * (an authorization: its capture; refused here, plainly, before 0016's
 * refunds_within_charge would refuse it as a check violation). */
static const char *SQL_RESERVE =
    "UPDATE payment_attempts SET refund_reserved = refund_reserved + $2::bigint"
    " WHERE id = $1::uuid AND refund_reserved + $2::bigint <="
    "   CASE capture_method WHEN 'manual' THEN coalesce(captured_amount, 0)"
    "   ELSE amount END RETURNING id";

static const char *SQL_SETTLE =
    "WITH u AS ("
    "  UPDATE refund_attempts r SET status = $2,"
    "    reason = CASE WHEN $2 = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE $3 END,"
    "    provider_refund_id = coalesce(r.provider_refund_id, $4::text),"
    "    reserved = r.reserved OR $2 = " ATTEMPT_SQL(SUCCEEDED) ","
    "    lease_owner = NULL, lease_expires_at = NULL, lease_epoch = r.lease_epoch + 1,"
    "    next_check_at = NULL, updated_at = " SQL_CHANGED_AT("r")
    "  WHERE r.id = $1::uuid AND r.status = $5"
    "  RETURNING r.id, r.payment_attempt_id, r.order_id, r.amount, r.currency,"
    "    r.provider_refund_id, r.status, r.reason, r.updated_at,"
    "    " SQL_REFUND_EVENT_TYPE("r.status") " AS event_type),"
    " t AS ("
    "  INSERT INTO refund_transitions (refund_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, $5, status, 'operator', $6, $3, $7::jsonb, updated_at FROM u),"
    SQL_REFUND_OUTBOX_EVENTS("u")
    "SELECT id FROM u";
/* clang-format on */

static int present(const char *s)
{
    return s && s[0];
}

/* Metadata naming another of ours: a non-empty id that is not ours (a
 * UUID may be written in either case). */
static int names_other(const char *named, const char *ours)
{
    return present(named) && strcasecmp(named, ours) != 0;
}

/* Whether the provider's refund of a SUCCEEDED decision is proven this
 * refund's, from the row SQL_LOCK read: RESOLVED when it may be booked.
 * Its intent decides first, force or not: a refund on another intent than
 * the charge's gave back another charge's money. */
static enum refund_review_outcome
judge_owner(PGresult *r, const struct refund_review_decision *d, char *why, size_t size)
{
    CHARGED_ASSERT(r && d && why && size > 0);
    const char *charge_intent = PQgetvalue(r, 0, 8);
    char because[128];
    if (!present(d->object_payment_intent)) {
        if (d->force)
            return REFUND_REVIEW_RESOLVED; /* the operator vouches: recorded forced */
        snprintf(why, size,
                 "nothing shows which intent %s is on, so it is not proven refund %s's",
                 d->provider_refund_id, d->refund_id);
        return REFUND_REVIEW_UNPROVEN;
    }
    if (!charge_intent[0]) {
        snprintf(why, size,
                 "refund %s's charge has no intent recorded: %s on %s is not "
                 "proven its",
                 d->refund_id, d->provider_refund_id, d->object_payment_intent);
        return REFUND_REVIEW_FOREIGN;
    }
    struct ownership_claim c = {
        .recorded_id = PQgetvalue(r, 0, 4),
        .object_id = d->provider_refund_id,
        .own_answer = PQgetvalue(r, 0, 9)[0] == 't',
        .recorded_elsewhere = PQgetvalue(r, 0, 5)[0] == 't',
        .parent_id = charge_intent,
        .object_parent_id = d->object_payment_intent,
    };
    if (ownership_judge(&c, because, sizeof(because)) == OWNERSHIP_FOREIGN) {
        snprintf(why, size, "%s (%s; the charge's is %s)", because,
                 d->object_payment_intent, charge_intent);
        return REFUND_REVIEW_FOREIGN;
    }
    c.names_another = names_other(d->object_refund_meta, d->refund_id) ||
                      names_other(d->object_attempt_meta, PQgetvalue(r, 0, 3));
    if (d->force)
        return REFUND_REVIEW_RESOLVED; /* the operator vouches: recorded forced */
    switch (ownership_judge(&c, because, sizeof(because))) {
    case OWNERSHIP_OURS:
        return REFUND_REVIEW_RESOLVED;
    case OWNERSHIP_FOREIGN:
        snprintf(why, size, "%s (refund %s, payment attempt %s)", because,
                 present(d->object_refund_meta) ? d->object_refund_meta : "-",
                 present(d->object_attempt_meta) ? d->object_attempt_meta : "-");
        return REFUND_REVIEW_NAMES_ANOTHER;
    case OWNERSHIP_UNPROVEN:
        break;
    }
    /* Only names it: anyone may have made it, and the refund's own call
     * under its key may have refunded the charge as well. */
    snprintf(why, size,
             "%s is not proven refund %s's: it only names it (metadata is anyone's "
             "to write), neither recorded from its own call nor the answer under its "
             "key",
             d->provider_refund_id, d->refund_id);
    return REFUND_REVIEW_UNPROVEN;
}

/* Whether a call under the refund's key may still execute, from the row
 * SQL_LOCK read: its lease is live (a worker or the reconciler may be
 * calling now), or its last call is younger than key_kept_ms (the provider
 * may still execute a request it holds). A negative age (a call recorded
 * after this transaction began) is young. RESOLVED when neither. */
static enum refund_review_outcome in_flight(PGresult *r,
                                            const struct refund_review_decision *d)
{
    CHARGED_ASSERT(r && d);
    if (PQgetvalue(r, 0, 6)[0] == 't')
        return REFUND_REVIEW_LEASED;
    if (!PQgetisnull(r, 0, 7) &&
        strtoll(PQgetvalue(r, 0, 7), NULL, 10) < d->key_kept_ms)
        return REFUND_REVIEW_MAY_EXECUTE;
    return REFUND_REVIEW_RESOLVED;
}

static enum charged_rc classify(const struct charged_error *err)
{
    CHARGED_ASSERT(err);
    if (!strcmp(err->code, "55P03"))
        return CHARGED_WAIT;
    if (err->code[0] == '2' && err->code[1] == '2')
        return CHARGED_BAD_ITEM;
    if (err->code[0] == '2' && err->code[1] == '3')
        return CHARGED_BAD_ITEM;
    return CHARGED_RETRY;
}

enum charged_rc refund_review_resolve(PGconn *conn,
                                      const struct refund_review_decision *d,
                                      enum refund_review_outcome *out, char *why,
                                      size_t why_size, struct charged_error *err)
{
    PGresult *r = NULL;
    enum charged_rc rc = CHARGED_RETRY;
    int in_tx = 0;
    struct charged_error ignore;
    const char *expected = attempt_status_name(d->expected);
    const char *status = attempt_status_name(d->status);
    char attempt[37], amount[24];

    CHARGED_ASSERT(out && why && why_size > 0);
    *out = REFUND_REVIEW_RESOLVED;
    why[0] = '\0';
    /* One id however it is written (a UUID: the database reads either
     * case), said in lower case as it is stored. */
    char rid[37];
    struct refund_review_decision canonical = *d;
    if (!d->refund_id || strlen(d->refund_id) >= sizeof(rid)) {
        *out = REFUND_REVIEW_NOT_FOUND; /* no UUID: never cut into one */
        return CHARGED_OK;
    }
    snprintf(rid, sizeof(rid), "%s", d->refund_id);
    for (char *p = rid; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    canonical.refund_id = rid;
    d = &canonical;
    if (db_run(conn, "BEGIN", 0, NULL, err) != 0)
        goto failed;
    in_tx = 1;
    /* An operator waits briefly for a worker's or webhook's statement, and
     * is told to try again rather than hang on a stuck session. */
    if (db_run(conn, "SET LOCAL lock_timeout = '2s'", 0, NULL, err) != 0)
        goto failed;
    const char *lp[2] = {d->refund_id, d->provider_refund_id};
    if (!(r = db_exec(conn, SQL_LOCK, 2, lp, err)))
        goto failed;
    if (PQntuples(r) != 1) {
        *out = REFUND_REVIEW_NOT_FOUND;
        goto done;
    }
    if (strcmp(PQgetvalue(r, 0, 0), expected) != 0) {
        *out = REFUND_REVIEW_CHANGED;
        goto done;
    }
    const char *recorded = PQgetvalue(r, 0, 4);
    if (PQgetvalue(r, 0, 5)[0] == 't' || (recorded[0] && d->provider_refund_id &&
                                          strcmp(recorded, d->provider_refund_id))) {
        *out = REFUND_REVIEW_OTHER_REFUND;
        goto done;
    }
    if (d->status == ATTEMPT_STATUS_SUCCEEDED &&
        (*out = judge_owner(r, d, why, why_size)) != REFUND_REVIEW_RESOLVED)
        goto done;
    /* Either decision waits while a call under the refund's key may still
     * execute: the refund's own answer (or the reconciler's replay under
     * its key) is still to come, and settles it on evidence. */
    if (!d->force && (*out = in_flight(r, d)) != REFUND_REVIEW_RESOLVED)
        goto done;
    int reserve =
        d->status == ATTEMPT_STATUS_SUCCEEDED && PQgetvalue(r, 0, 1)[0] != 't';
    snprintf(amount, sizeof(amount), "%s", PQgetvalue(r, 0, 2));
    snprintf(attempt, sizeof(attempt), "%s", PQgetvalue(r, 0, 3));
    PQclear(r);
    r = NULL;
    if (reserve) {
        const char *rp[2] = {attempt, amount};
        if (!(r = db_exec(conn, SQL_RESERVE, 2, rp, err)))
            goto failed;
        if (PQntuples(r) != 1) {
            *out = REFUND_REVIEW_EXCEEDS;
            goto done;
        }
        PQclear(r);
        r = NULL;
    }
    const char *sp[7] = {d->refund_id, status,   d->reason,       d->provider_refund_id,
                         expected,     d->actor, d->evidence_json};
    if (!(r = db_exec(conn, SQL_SETTLE, 7, sp, err)))
        goto failed;
    if (PQntuples(r) != 1) {
        /* Impossible under the row lock; never commit half a decision. */
        charged_error_set(err, "refund %s changed under its lock", d->refund_id);
        goto out;
    }
    if (db_run(conn, "COMMIT", 0, NULL, err) != 0)
        goto failed;
    in_tx = 0;
    rc = CHARGED_OK;
    goto out;
done:
    rc = CHARGED_OK;
    goto out;
failed:
    rc = classify(err);
out:
    PQclear(r);
    if (in_tx)
        db_run(conn, "ROLLBACK", 0, NULL, &ignore);
    return rc;
}
