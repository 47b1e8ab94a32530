#include "void_op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "charge_command.h"
#include "op_shared.h"
#include "payment_answer.h"

struct void_command {
    char void_id[37];
    char payment_intent_id[96];
    char idempotency_key[129];
};

/* What a claim says to send: the recorded void's, never the message's. */
struct void_params {
    char idempotency_key[129];
    char payment_intent_id[96];
};

struct void_state {
    char *url, *actor;
    PGconn *conn;
};

const char *const void_op_schema[] = {
    "CREATE TABLE voids ("
    " id uuid PRIMARY KEY,"
    " idempotency_key text NOT NULL UNIQUE,"
    " payment_intent_id text NOT NULL,"
    " status text NOT NULL DEFAULT 'PENDING',"
    " lease_owner text, lease_epoch bigint NOT NULL DEFAULT 0, lease_until timestamptz,"
    " first_sent_at timestamptz, calls int NOT NULL DEFAULT 0,"
    " reason text, provider_id text, last_error text)",
    "CREATE TABLE void_calls (void_id uuid NOT NULL REFERENCES voids,"
    " started_ms bigint NOT NULL, outcome text NOT NULL, http_status int NOT NULL)",
    "CREATE TABLE void_events (void_id uuid NOT NULL REFERENCES voids,"
    " event_type text NOT NULL, UNIQUE (void_id, event_type))",
    NULL,
};

static void *void_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    struct void_state *v = calloc(1, sizeof(*v));
    if (v) {
        v->url = strdup(config_str(cfg, CONFIG_DATABASE_URL));
        v->actor = strdup(actor);
    }
    if (!v || !v->url || !v->actor) {
        charged_error_set(err, "out of memory");
        if (v) {
            free(v->url);
            free(v->actor);
        }
        free(v);
        return NULL;
    }
    return v;
}

static void void_close(void *op)
{
    struct void_state *v = op;
    if (!v)
        return;
    if (v->conn)
        PQfinish(v->conn);
    free(v->url);
    free(v->actor);
    free(v);
}

static enum dead_letter_reason void_parse(void *op, const void *key, size_t key_len,
                                          const void *value, size_t value_len,
                                          void *command, struct charged_error *err)
{
    struct void_command *c = command;
    json_error_t jerr;
    enum dead_letter_reason why = DEAD_LETTER_NONE;
    (void)op;
    if (!value || value_len == 0) {
        charged_error_set(err, "empty value");
        return DEAD_LETTER_EMPTY_VALUE;
    }
    json_t *o = json_loadb(value, value_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o || !json_is_object(o)) {
        charged_error_set(err, "not a JSON object");
        json_decref(o);
        return DEAD_LETTER_MALFORMED_JSON;
    }
    const char *id = json_string_value(json_object_get(o, "void_id"));
    const char *pi = json_string_value(json_object_get(o, "payment_intent_id"));
    const char *ik = json_string_value(json_object_get(o, "idempotency_key"));
    if (!id || !charge_command_is_uuid(id) || !pi || !*pi ||
        strlen(pi) >= sizeof(c->payment_intent_id) || !ik || !*ik ||
        strlen(ik) >= sizeof(c->idempotency_key)) {
        charged_error_set(err, "void_id, payment_intent_id or idempotency_key invalid");
        why = DEAD_LETTER_SCHEMA_VIOLATION;
    } else if (!key || key_len != strlen(id) || memcmp(key, id, key_len) != 0) {
        charged_error_set(err, "the message key is not the void_id");
        why = DEAD_LETTER_KEY_MISMATCH;
    } else {
        snprintf(c->void_id, sizeof(c->void_id), "%s", id);
        snprintf(c->payment_intent_id, sizeof(c->payment_intent_id), "%s", pi);
        snprintf(c->idempotency_key, sizeof(c->idempotency_key), "%s", ik);
    }
    json_decref(o);
    return why;
}

static void void_release(void *command)
{
    (void)command; /* nothing outside the job's own bytes */
}

static const char *void_id_of(const void *command)
{
    return ((const struct void_command *)command)->void_id;
}

static const char *void_order_of(const void *command)
{
    (void)command;
    return NULL; /* a void belongs to no order of ours */
}

/* ---- the store: one parameterized statement per item ---- */

static enum charged_rc classify(struct void_state *v, PGresult *r,
                                struct charged_error *err)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    charged_error_set(err, "void store: %s", PQerrorMessage(v->conn));
    snprintf(err->code, sizeof(err->code), "%s", state ? state : "");
    if (PQstatus(v->conn) != CONNECTION_OK) {
        PQfinish(v->conn);
        v->conn = NULL;
        return CHARGED_RETRY;
    }
    if (state && !strcmp(state, "55P03"))
        return CHARGED_WAIT;
    if (state && (!strncmp(state, "22", 2) || !strncmp(state, "23", 2)))
        return CHARGED_BAD_ITEM;
    return CHARGED_RETRY;
}

/* Runs q; *out holds its result (PQclear it) when CHARGED_OK. */
static enum charged_rc run(struct void_state *v, const char *q, int n,
                           const char *const *p, PGresult **out,
                           struct charged_error *err)
{
    charged_error_clear(err);
    *out = NULL;
    if (!v->conn) {
        v->conn = PQconnectdb(v->url);
        if (PQstatus(v->conn) != CONNECTION_OK)
            return classify(v, NULL, err);
        PQclear(PQexec(v->conn, "SET lock_timeout = '100ms'"));
    }
    PGresult *r = PQexecParams(v->conn, q, n, NULL, p, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        enum charged_rc rc = classify(v, r, err);
        PQclear(r);
        return rc;
    }
    *out = r;
    return CHARGED_OK;
}

static enum charged_rc void_ping(void *op, struct charged_error *err)
{
    PGresult *r;
    enum charged_rc rc = run(op, "SELECT 1", 0, NULL, &r, err);
    PQclear(r);
    return rc;
}

static enum charged_rc void_record(void *op, struct engine_record *items, size_t n,
                                   long long lease_ms, struct charged_error *err)
{
    (void)lease_ms;
    enum charged_rc rc = CHARGED_OK;
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        const struct void_command *c = items[i].command;
        const char *p[] = {c->void_id, c->idempotency_key, c->payment_intent_id};
        PGresult *r;
        /* Insert or find: the row of the id or of the key must be this very
         * void, or the key is reused. */
        rc = run(
            op,
            "WITH ins AS (INSERT INTO voids (id, idempotency_key, payment_intent_id)"
            " VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1)"
            " SELECT count(*) FROM ins",
            3, p, &r, err);
        PQclear(r);
        if (rc != CHARGED_OK)
            break;
        rc = run(op,
                 "SELECT count(*) FILTER (WHERE id <> $1 OR idempotency_key <> $2"
                 " OR payment_intent_id <> $3), count(*)"
                 " FROM voids WHERE id = $1 OR idempotency_key = $2",
                 3, p, &r, err);
        if (rc != CHARGED_OK)
            break;
        int others = atoi(PQgetvalue(r, 0, 0)), rows = atoi(PQgetvalue(r, 0, 1));
        PQclear(r);
        items[i].reason[0] = '\0';
        if (others > 0) {
            items[i].result = ENGINE_CONFLICT;
            snprintf(items[i].reason, sizeof(items[i].reason),
                     "void_id or idempotency_key reused with other parameters");
        } else {
            items[i].result = rows ? ENGINE_RECORDED : ENGINE_RECORD_AGAIN;
        }
    }
    return rc;
}

static enum charged_rc void_claim(void *op, struct engine_claim *items, size_t n,
                                  long long lease_ms, struct charged_error *err)
{
    struct void_state *v = op;
    enum charged_rc rc = CHARGED_OK;
    char lease[32];
    snprintf(lease, sizeof(lease), "%lld", lease_ms);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        struct engine_claim *it = &items[i];
        const char *p[] = {it->id, v->actor, lease};
        PGresult *r;
        rc =
            run(op,
                "UPDATE voids SET lease_owner = $2, lease_epoch = lease_epoch + 1,"
                " lease_until = now() + $3::bigint * interval '1 millisecond',"
                " status = 'PROCESSING', first_sent_at = coalesce(first_sent_at, now())"
                " WHERE id = (SELECT id FROM voids WHERE id = $1"
                "  AND status IN ('PENDING', 'PROCESSING')"
                "  AND (lease_until IS NULL OR lease_until < now())"
                "  FOR NO KEY UPDATE SKIP LOCKED)"
                " RETURNING lease_epoch,"
                " (extract(epoch FROM now() - first_sent_at) * 1000)::bigint,"
                " idempotency_key, payment_intent_id",
                3, p, &r, err);
        if (rc != CHARGED_OK)
            break;
        if (PQntuples(r) == 1) {
            struct void_params *vp = it->params;
            it->result = ENGINE_CLAIMED;
            it->lease_epoch = atoll(PQgetvalue(r, 0, 0));
            it->key_age_ms = atoll(PQgetvalue(r, 0, 1));
            snprintf(vp->idempotency_key, sizeof(vp->idempotency_key), "%s",
                     PQgetvalue(r, 0, 2));
            snprintf(vp->payment_intent_id, sizeof(vp->payment_intent_id), "%s",
                     PQgetvalue(r, 0, 3));
            PQclear(r);
            continue;
        }
        PQclear(r);
        rc = run(op, "SELECT status FROM voids WHERE id = $1", 1, p, &r, err);
        if (rc != CHARGED_OK)
            break;
        const char *status = PQntuples(r) ? PQgetvalue(r, 0, 0) : "PENDING";
        snprintf(it->status, sizeof(it->status), "%s", status);
        it->result = !strcmp(status, "PENDING") || !strcmp(status, "PROCESSING")
                         ? ENGINE_BUSY
                         : ENGINE_SETTLED;
        PQclear(r);
    }
    return rc;
}

static enum charged_rc void_log_calls(void *op, const struct engine_call *calls,
                                      size_t n, struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        char started[32], status[16];
        snprintf(started, sizeof(started), "%lld", (long long)calls[i].started_ms);
        snprintf(status, sizeof(status), "%d", calls[i].res->http_status);
        const char *p[] = {calls[i].id, started,
                           provider_outcome_name(calls[i].res->outcome), status,
                           calls[i].written_maybe ? "t" : "f"};
        PGresult *r;
        /* A call whose earlier write may have committed is written once. */
        rc = run(op,
                 "INSERT INTO void_calls (void_id, started_ms, outcome, http_status)"
                 " SELECT $1, $2, $3, $4 WHERE NOT ($5::bool AND EXISTS (SELECT 1"
                 "  FROM void_calls WHERE void_id = $1 AND started_ms = $2"
                 "  AND outcome = $3 AND http_status = $4))",
                 5, p, &r, err);
        PQclear(r);
    }
    return rc;
}

static enum charged_rc void_persist(void *op, struct engine_outcome *items, size_t n,
                                    struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        struct engine_outcome *o = &items[i];
        char epoch[32], calls[16];
        snprintf(epoch, sizeof(epoch), "%lld", (long long)o->lease_epoch);
        snprintf(calls, sizeof(calls), "%d", o->calls);
        const char *p[] = {o->id,
                           epoch,
                           o->status,
                           o->reason,
                           o->provider_id && *o->provider_id ? o->provider_id : NULL,
                           calls,
                           o->last_error,
                           o->event_type};
        PGresult *r;
        /* Fenced: only the claim this outcome belongs to may write it; the
         * event goes with the status, in one statement. */
        rc =
            run(op,
                "WITH u AS (UPDATE voids SET status = $3, reason = $4,"
                "  provider_id = $5, calls = calls + $6::int, last_error = $7,"
                "  lease_until = NULL"
                "  WHERE id = $1 AND lease_epoch = $2::bigint AND status = 'PROCESSING'"
                "  RETURNING id),"
                " e AS (INSERT INTO void_events (void_id, event_type)"
                "  SELECT id, $8 FROM u WHERE $8::text IS NOT NULL"
                "  ON CONFLICT DO NOTHING)"
                " SELECT count(*) FROM u",
                8, p, &r, err);
        if (rc != CHARGED_OK)
            break;
        o->persisted = atoi(PQgetvalue(r, 0, 0)) == 1;
        o->busy = 0;
        PQclear(r);
    }
    return rc;
}

static enum charged_rc void_renew(void *op, const char *const *ids, const int *kinds,
                                  const int64_t *epochs, size_t n, long long lease_ms,
                                  int *still_ours, struct charged_error *err)
{
    (void)kinds;
    enum charged_rc rc = CHARGED_OK;
    char lease[32];
    snprintf(lease, sizeof(lease), "%lld", lease_ms);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        char epoch[32];
        snprintf(epoch, sizeof(epoch), "%lld", (long long)epochs[i]);
        const char *p[] = {ids[i], epoch, lease};
        PGresult *r;
        rc = run(op,
                 "UPDATE voids SET lease_until = now() + $3::bigint * interval "
                 "'1 millisecond' WHERE id = $1 AND lease_epoch = $2::bigint"
                 " AND status = 'PROCESSING' RETURNING 1",
                 3, p, &r, err);
        if (rc == CHARGED_OK)
            still_ours[i] = PQntuples(r) == 1;
        PQclear(r);
    }
    return rc;
}

/* Its table keeps no waits: the engine's are said, and forgotten. */
static enum charged_rc void_wait(void *op, const struct store_wait *items, size_t n,
                                 struct charged_error *err)
{
    (void)op;
    (void)items;
    (void)n;
    charged_error_clear(err);
    return CHARGED_OK;
}

static enum charged_rc void_release_leases(void *op, const char *const *ids,
                                           const int *kinds, const int64_t *epochs,
                                           size_t n, struct charged_error *err)
{
    (void)kinds;
    enum charged_rc rc = CHARGED_OK;
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        char epoch[32];
        snprintf(epoch, sizeof(epoch), "%lld", (long long)epochs[i]);
        const char *p[] = {ids[i], epoch};
        PGresult *r;
        rc = run(op,
                 "UPDATE voids SET lease_until = now() WHERE id = $1"
                 " AND lease_epoch = $2::bigint AND status = 'PROCESSING'",
                 2, p, &r, err);
        PQclear(r);
    }
    return rc;
}

static const char *void_object_of(int kind, const void *params)
{
    (void)kind;
    return ((const struct void_params *)params)->payment_intent_id;
}

static enum charged_rc void_start_call(void *op, provider_client_t *pc,
                                       const void *params, const void *command,
                                       void *tag, struct charged_error *err)
{
    const struct void_params *vp = params;
    (void)op;
    (void)command;
    const struct provider_void v = {.idempotency_key = vp->idempotency_key,
                                    .payment_intent = vp->payment_intent_id,
                                    .reason = "requested_by_customer"};
    return provider_client_start_void(pc, &v, tag, err);
}

static const char *void_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    switch (status) {
    case ATTEMPT_STATUS_SUCCEEDED:
        return "void.succeeded";
    case ATTEMPT_STATUS_FAILED:
        return "void.failed";
    case ATTEMPT_STATUS_UNKNOWN:
        return "void.unknown";
    case ATTEMPT_STATUS_REQUIRES_REVIEW:
        return "void.requires_review";
    default:
        return NULL;
    }
}

/* The intent's cancel: the provider's capture class, first served. */
static void void_budget_of(int kind, enum budget_class *cls, enum budget_priority *prio)
{
    (void)kind;
    *cls = BUDGET_CLASS_CAPTURE;
    *prio = BUDGET_PRIO_CAPTURE;
}

const struct engine_op void_op = {
    .name = "void",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct void_command),
    .params_size = sizeof(struct void_params),
    OP_CALLBACKS(void),
    OP_STORE_CALLBACKS(void),
    /* Decided by the charge's table, as a void's answer means the same. */
    .decide = payment_answer_decide,
    .outcome = payment_answer_outcome,
    .budget_of = void_budget_of,
};
