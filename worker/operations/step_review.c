#include "step_review.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_review.h"
#include "charged_assert.h"
#include "clock.h"
#include "command_fields.h"
#include "store_stmt.h"

int step_review_answered(const struct provider_result *r)
{
    CHARGED_ASSERT(r);
    return r->outcome != PROVIDER_UNKNOWN && r->outcome != PROVIDER_NOT_EXECUTED &&
           r->outcome != PROVIDER_INVALID && r->outcome != PROVIDER_NOT_FOUND &&
           r->intent_status[0] != '\0';
}

const char *step_review_decisions(const struct step_review_kind *k, char *buf,
                                  size_t size)
{
    CHARGED_ASSERT(k && buf && size > 0);
    size_t used = 0;
    int n = 0;
    buf[0] = '\0';
    for (int st = 0; st < ATTEMPT_STATUS__COUNT; st++) {
        if (!(k->decisions & (1u << st)))
            continue;
        int more = k->decisions >> (st + 1) != 0;
        int w = snprintf(buf + used, size - used, "%s%s",
                         n == 0 ? ""
                         : more ? ", "
                                : " or ",
                         attempt_status_name((enum attempt_status)st));
        if (w < 0 || (size_t)w >= size - used)
            break;
        used += (size_t)w;
        n++;
    }
    return buf;
}

void step_review_result_clear(struct step_review_result *r)
{
    if (!r)
        return;
    json_decref(r->evidence);
    r->evidence = NULL;
}

static int finish(struct step_review_result *out, enum step_review_outcome o,
                  const char *fmt, const char *a, const char *b)
{
    out->outcome = o;
    snprintf(out->message, sizeof(out->message), fmt, a ? a : "", b ? b : "");
    return 0;
}

/* The request as an attempt's review checks it (attempt_review_check): a
 * UUID, a reason, an actor; its why in a step's terms. */
static int check(const struct step_review_kind *k, const struct step_review_request *rq,
                 struct step_review_result *out)
{
    char why[300];
    struct attempt_review_request as = {
        .attempt_id = rq->id, .reason = rq->reason, .actor = rq->actor};
    if ((unsigned)rq->decision >= ATTEMPT_STATUS__COUNT ||
        !(k->decisions & (1u << rq->decision)))
        return finish(out, STEP_REVIEW_ERROR, "decision must be %s%s",
                      step_review_decisions(k, why, sizeof(why)), NULL),
               -1;
    if (!rq->reason)
        return finish(out, STEP_REVIEW_ERROR,
                      "reason is required: say how you know%s%s", NULL, NULL),
               -1;
    if (attempt_review_check(&as, why, sizeof(why)) == 0)
        return 0;
    if (!strncmp(why, "attempt id", 10))
        return finish(out, STEP_REVIEW_ERROR, "%s id%s", k->noun, why + 10), -1;
    return finish(out, STEP_REVIEW_ERROR, "%s%s", why, NULL), -1;
}

/* Reads the step: 1 found, 0 none, -1 with err. */
static int load(const struct step_review_kind *k, store_conn_t *db, const char *id,
                struct step_review_row *row, struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r = NULL;
    int found = -1;
    stmt_text(&s, id);
    if (stmt_run(db, &s, k->load_sql, &r, err) == CHARGED_OK) {
        found = PQntuples(r) == 1;
        if (found) {
            memset(row, 0, sizeof(*row));
            stmt_col_copy(r, 0, 0, row->id, sizeof(row->id));
            stmt_col_copy(r, 0, 1, row->attempt_id, sizeof(row->attempt_id));
            stmt_col_copy(r, 0, 2, row->status, sizeof(row->status));
            stmt_col_copy(r, 0, 3, row->attempt_status, sizeof(row->attempt_status));
            stmt_col_copy(r, 0, 4, row->payment_intent, sizeof(row->payment_intent));
            row->asked = stmt_col_int(r, 0, 5);
            row->authorized = stmt_col_int(r, 0, 6);
            row->holds = stmt_col_true(r, 0, 7);
            row->leased = stmt_col_true(r, 0, 8);
            row->key_age_ms = PQgetisnull(r, 0, 9) ? -1 : stmt_col_int(r, 0, 9);
        }
    }
    PQclear(r);
    stmt_release(&s);
    return found;
}

/* Asks the provider for the authorization's intent, by the id charged
 * recorded: the verdict, and *res what it answered. */
static const char *ask(const struct step_review_kind *k, provider_client_t *pc,
                       const struct step_review_request *rq,
                       const struct step_review_row *row, struct provider_result *res,
                       int64_t *started_ms, char *says, size_t size)
{
    *started_ms = 0;
    memset(res, 0, sizeof(*res));
    res->amount_received = res->amount_capturable = -1;
    if (!row->payment_intent[0]) {
        snprintf(says, size, "no intent is recorded for %s %s's %s", k->noun, row->id,
                 k->holder);
        return "no_answer";
    }
    *started_ms = clock_wall_ms();
    provider_client_retrieve(pc, row->payment_intent, res);
    if (!step_review_answered(res)) {
        snprintf(says, size, "the provider did not answer the look-up of %s: %s",
                 row->payment_intent,
                 res->error[0] ? res->error : provider_outcome_name(res->outcome));
        return "no_answer";
    }
    return k->judge(res, rq->decision, row, says, size);
}

static json_t *evidence_of(const struct step_review_kind *k,
                           const struct step_review_request *rq,
                           const struct step_review_row *row,
                           const struct step_review_result *out,
                           const struct provider_result *res)
{
    json_t *look = json_pack(
        "{s:s, s:s, s:i, s:s*, s:I, s:I, s:I, s:s*}", "operation", "retrieve",
        "payment_intent_id", row->payment_intent, "http_status", res->http_status,
        "intent_status", res->intent_status[0] ? res->intent_status : NULL, "amount",
        res->amount, "amount_received", res->amount_received, "amount_capturable",
        res->amount_capturable, "cancellation_reason",
        res->cancellation_reason[0] ? res->cancellation_reason : NULL);
    return json_pack(
        "{s:s, s:s, s:s*, s:b, s:s, s:o*, s:o*}", "decision",
        attempt_status_name(rq->decision), "provider", out->verdict, "provider_says",
        out->provider_says[0] ? out->provider_says : NULL, "forced", out->forced,
        k->holder_status_key, row->attempt_status, "key_age_ms",
        row->key_age_ms >= 0 ? json_integer(row->key_age_ms) : NULL, "lookup", look);
}

static void call_at(const void *items, size_t i, struct stmt_call *c)
{
    *c = ((const struct stmt_call *)items)[i];
}

/* The decision's transaction, with the look-up made at started_ms (0:
 * none): CHARGED_OK with *moved, or the failure. */
static enum charged_rc write_tx(const struct step_review_kind *k, store_conn_t *db,
                                const struct step_review_request *rq,
                                const struct step_review_row *row,
                                const struct provider_result *res, int64_t started_ms,
                                const char *evidence, int *moved, char *why,
                                size_t why_size, struct charged_error *err)
{
    struct charged_error ignore = {0};
    enum charged_rc rc = store_conn_exec(db, "BEGIN", 0, NULL, NULL, err);
    if (rc != CHARGED_OK)
        return rc;
    rc = store_conn_exec(db, "SET LOCAL lock_timeout = '2s'", 0, NULL, NULL, err);
    if (rc == CHARGED_OK && started_ms > 0) {
        const struct stmt_call call = {row->id, "retrieve", started_ms, res, 0};
        rc = stmt_log_calls(db, rq->actor, k->log_calls_sql, &call, 1, call_at,
                            "retrieve", err);
    }
    if (rc == CHARGED_OK)
        rc = k->write(db, rq, row, res, evidence, moved, why, why_size, err);
    if (rc == CHARGED_OK && *moved)
        return store_conn_exec(db, "COMMIT", 0, NULL, NULL, err);
    store_conn_exec(db, "ROLLBACK", 0, NULL, NULL, &ignore);
    return rc;
}

/* Writes the decision asked and judged: the outcome in out. */
static void decide(const struct step_review_kind *k, store_conn_t *db,
                   const struct step_review_request *rq,
                   const struct step_review_row *row, const struct provider_result *res,
                   int64_t started_ms, struct step_review_result *out)
{
    struct charged_error err = {0};
    char why[300] = "";
    int moved = 0;
    char *text;
    out->evidence = evidence_of(k, rq, row, out, res);
    text = out->evidence ? json_dumps(out->evidence, JSON_COMPACT) : NULL;
    if (!text) {
        finish(out, STEP_REVIEW_ERROR, "out of memory%s%s", NULL, NULL);
        return;
    }
    enum charged_rc rc =
        write_tx(k, db, rq, row, res, started_ms, text, &moved, why, sizeof(why), &err);
    free(text);
    if (rc == CHARGED_WAIT)
        finish(
            out, STEP_REVIEW_BUSY,
            "%s %s is locked by another session right now; nothing written, run again",
            k->noun, row->id);
    else if (rc != CHARGED_OK)
        finish(out, STEP_REVIEW_ERROR, "the database refused the resolution: %s%s",
               err.message, NULL);
    else if (!moved)
        finish(out, STEP_REVIEW_CHANGED, "%s; nothing written%s", why, NULL);
    else {
        snprintf(out->status, sizeof(out->status), "%s",
                 attempt_status_name(rq->decision));
        finish(out, STEP_REVIEW_RESOLVED, "%s %s resolved", k->noun, row->id);
        snprintf(out->message + strlen(out->message),
                 sizeof(out->message) - strlen(out->message), " %s%s", out->status,
                 out->forced ? " (forced over the provider)" : "");
    }
}

/* The step read and in review, not leased: 0, else out says why not. */
static int reviewable(const struct step_review_kind *k, store_conn_t *db,
                      const char *id, struct step_review_row *row,
                      struct step_review_result *out)
{
    struct charged_error err = {0};
    int found = load(k, db, id, row, &err);
    if (found < 0)
        return finish(out, STEP_REVIEW_ERROR, "%s%s", err.message, NULL), -1;
    if (!found)
        return finish(out, STEP_REVIEW_NOT_FOUND, "no %s %s", k->noun, id), -1;
    snprintf(out->status, sizeof(out->status), "%s", row->status);
    if (strcmp(row->status, "REQUIRES_REVIEW") != 0) {
        finish(out, STEP_REVIEW_NOT_IN_REVIEW, "%s %s is ", k->noun, id);
        strncat(out->message, row->status,
                sizeof(out->message) - strlen(out->message) - 1);
        strncat(out->message, ", not REQUIRES_REVIEW: only those are resolved",
                sizeof(out->message) - strlen(out->message) - 1);
        return -1;
    }
    if (row->leased)
        return finish(out, STEP_REVIEW_BUSY,
                      "%s %s is leased by a process that may be calling the provider "
                      "now; nothing written, run again later",
                      k->noun, id),
               -1;
    return 0;
}

int step_review_resolve(const struct step_review_kind *k, const char *database_url,
                        provider_client_t *pc, const struct step_review_request *rq,
                        struct step_review_result *out)
{
    if (!out)
        return -1;
    CHARGED_ASSERT(k && database_url && pc && rq);
    CHARGED_ASSERT(k->holder && k->holder_status_key);
    struct charged_error err = {0};
    struct step_review_row row;
    struct provider_result res;
    int64_t started_ms = 0;
    char id[37] = "";
    memset(out, 0, sizeof(*out));
    if (check(k, rq, out) != 0)
        return 0;
    snprintf(id, sizeof(id), "%s", rq->id);
    command_fields_lower(id);
    store_conn_t *db = store_conn_new(database_url, "2s", &err);
    if (!db || store_conn_open(db, NULL, &err) != CHARGED_OK) {
        finish(out, STEP_REVIEW_ERROR, "%s%s", err.message, NULL);
        goto out;
    }
    if (reviewable(k, db, id, &row, out) != 0)
        goto out;
    /* A call the provider holds under the key may still execute: the
     * reconciler settles such a step on evidence; a person waits. */
    if (row.key_age_ms >= 0 && row.key_age_ms < rq->key_kept_ms) {
        out->verdict = "may_execute";
        snprintf(out->provider_says, sizeof(out->provider_says),
                 "a call under %s %s's key is %lld ms old, younger than "
                 "WORKER_KEY_RETENTION_MS (%lld ms): the provider may still execute it",
                 k->noun, id, row.key_age_ms, rq->key_kept_ms);
        if (!rq->force) {
            finish(out, STEP_REVIEW_REFUSED,
                   "refused: %s; nothing written (force "
                   "overrides)%s",
                   out->provider_says, NULL);
            goto out;
        }
        out->forced = 1;
        out->provider_says[0] = '\0'; /* the evidence's key_age_ms says it */
    }
    out->verdict = ask(k, pc, rq, &row, &res, &started_ms, out->provider_says,
                       sizeof(out->provider_says));
    if (strcmp(out->verdict, "agrees") != 0) {
        if (!rq->force) {
            finish(out, STEP_REVIEW_REFUSED,
                   "refused: %s; nothing written (force "
                   "overrides)%s",
                   out->provider_says, NULL);
            goto out;
        }
        out->forced = 1;
    }
    if (rq->still_allowed && !rq->still_allowed(rq->ctx)) {
        finish(out, STEP_REVIEW_WITHDRAWN, "%s may no longer decide; nothing written%s",
               rq->actor, NULL);
        goto out;
    }
    decide(k, db, rq, &row, &res, started_ms, out);
out:
    store_conn_free(db);
    return 0;
}
