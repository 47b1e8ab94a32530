/* op: the face of a payment operation in every role, and the table of
 * them (operations.c).
 *
 * An operation (a charge, a refund) is one folder under worker/operations/
 * and one struct payment_op: its name and command type, its worker stages
 * (a struct engine_op, engine.h) and the hooks each other role calls for
 * its records. The roles walk the table and never name an operation: a
 * new one is a folder and one line of the table. Like git's struct
 * ref_storage_be behind refs.h, one face and a backend per kind; unlike
 * it, a hook an operation does not need is NULL, and the comment at each
 * says what a role does then.
 *
 * An operation's index in the table is its kind: what the engine's items
 * (engine_op.kind_of) and the reconciler's batches carry. */
#ifndef CHARGED_OP_H
#define CHARGED_OP_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_history.h"
#include "attempt_status.h"
#include "audit_policy.h"
#include "charge_command.h"
#include "charged_assert.h"
#include "charged_error.h"
#include "dead_letter_reason.h"
#include "engine.h"
#include "provider_client.h"
#include "reconcile_look.h"
#include "step_review.h"
#include "store_conn.h"
#include "webhook_event.h"
#include "webhook_store.h"

/* Bytes of any operation's parsed command and of what any claim says to
 * send: the worker's descriptor keeps one of each per job, whatever its
 * kind. Each operation static-asserts that its own fit. */
#define PAYMENT_OP_COMMAND_MAX 3072
#define PAYMENT_OP_PARAMS_MAX  3072
/* Operations in the table, at most (arrays indexed by kind). */
#define PAYMENT_OPS_MAX 8
/* Call rows one look's settlement writes at most: its calls, and the
 * answers lost when the HTTP client re-sent a call itself. */
#define OP_LOOK_ROWS_MAX 8
_Static_assert(OP_LOOK_ROWS_MAX >= RECONCILE_LOOK_MAX_CALLS, "a row for every answer");

/* ---- the reconciler's look (worker/roles/reconciler*.c) ---- */

/* What a look needs of the reconciler, the same for every operation. */
struct op_look_env {
    provider_client_t *provider;
    struct reconcile_limits lim;
    /* A retrieve's object when not the row's recorded one
     * (reconcile_decision.object_id: an authorization's replayed hold);
     * NULL: the row's. */
    const char *object_id;
};

/* Where a look at a claimed record starts (begin fills it). */
struct op_look_start {
    const char *id;
    int64_t lease_epoch;
    enum attempt_status from; /* as claimed */
    int checks;               /* looks so far */
    /* Log fields: the charge's order (NULL: left out), and the value of
     * the operation's about_key. */
    const char *order_id, *about;
    /* The provider's object its calls are about (a charge's or an
     * authorization's payment method, a step's payment intent): 429s
     * about it alone are its own, not the account's (reconciler.c). NULL:
     * none. */
    const char *object;
};

/* One call as provider_calls records it. */
struct op_call_row {
    const char *operation; /* a string literal */
    int64_t started_ms;    /* epoch ms */
    const struct provider_result *res;
};

/* A call kept while the database was away, written later. */
struct op_kept_call {
    const char *id; /* the record's */
    const char *operation;
    int64_t started_ms;
    const struct provider_result *res;
    int written_maybe; /* a write of it failed, and may yet commit */
};

/* A look's settlement, written fenced on the lease with its calls. */
struct op_settlement {
    const char *id;
    int64_t lease_epoch;
    enum attempt_status expected, status;
    const char *reason, *object_id, *evidence_json; /* may be NULL */
    /* The money the decision says moved (reconcile_decision's amount: a
     * capture's captured amount), 0 none: the settlement writes it with
     * the status, so it is carried, not re-read. */
    long long amount;
    long long next_check_ms; /* < 0: none */
    /* A look a 429 ended (reconcile_decision.throttled): no look, so not
     * counted among the record's checks (reconcile_checks). */
    int throttled;
    const struct op_call_row *rows;
    size_t nrows;      /* at most OP_LOOK_ROWS_MAX */
    int settled, busy; /* out */
};

/* The reconciler's face of an operation: its store (claim records due for
 * a look, keep their leases, write the calls and the settlement), the
 * calls a look makes (reconcile_look.h names which), and the words of its
 * log lines. Every store hook answers an enum charged_rc and fills err. */
struct op_reconcile {
    /* Log words: "attempt"; the id's field; the field of what the record
     * is about, and of the provider's object; what a refusal refused. */
    struct op_look_words {
        const char *noun, *id_key, *about_key, *object_key, *refused;
    } words;
    /* db_failed's stages. */
    struct op_look_stages {
        const char *claim, *settle, *backlog;
    } stages;
    /* enum metric_key: settlements by status; backlog and oldest gauges. */
    struct op_look_metrics {
        unsigned settlements, backlog, oldest;
    } metrics;
    size_t due_size; /* bytes of one claimed row */

    /* The store of database_url for actor, claiming what the look's
     * limits and the operation's own settings in cfg make due; does not
     * connect. NULL and err when it cannot be built. */
    void *(*store_new)(const char *database_url, const char *actor,
                       const struct reconcile_limits *lim, const config_t *cfg,
                       struct charged_error *err);
    void (*store_free)(void *store);
    /* Up to max rows due for a look into the array due (max * due_size
     * bytes), each claimed under a lease of lease_ms; *n of them. */
    enum charged_rc (*claim_due)(void *store, void *due, size_t max, size_t *n,
                                 long long lease_ms, long long stale_ms,
                                 struct charged_error *err);
    /* A claimed row's id and lease epoch (pointers into the row). */
    void (*due_lease)(const void *row, const char **id, const int64_t **epoch);
    enum charged_rc (*renew)(void *store, const char *const *ids, const int64_t *epochs,
                             size_t n, long long lease_ms, int *still_ours,
                             struct charged_error *err);
    /* Gives claims back as they were before the reconciler claimed them. */
    enum charged_rc (*hand_back)(void *store, const char *const *ids,
                                 const int64_t *epochs, size_t n,
                                 struct charged_error *err);
    enum charged_rc (*log_calls)(void *store, const struct op_kept_call *calls,
                                 size_t n, struct charged_error *err);
    /* How many records wait in each of statuses, and the oldest's age. */
    enum charged_rc (*backlog)(void *store, const enum attempt_status *statuses,
                               size_t n, long long *counts, long long *oldest_ms,
                               struct charged_error *err);

    /* The claimed row into *start, and the look's core begun. */
    void (*begin)(const struct op_look_env *env, const void *row,
                  struct op_look_start *start, struct reconcile_look *core,
                  int64_t claimed_at);
    /* A call other than the list (next), into *res. */
    void (*call)(const struct op_look_env *env, const void *row,
                 enum reconcile_next next, struct provider_result *res);
    /* One page of its list, after the object `after` ("" first). */
    void (*page)(const struct op_look_env *env, const void *row, const char *after,
                 struct provider_result *page);
    enum charged_rc (*settle)(void *store, struct op_settlement *s,
                              struct charged_error *err);
};

/* The store hooks of an operation whose store has the reconciler's calls
 * under its own names and types (<store>_new, _free, _claim_due, _renew,
 * _hand_back, _log_calls, _backlog; rows of `row`, with an id and a
 * lease_epoch; call rows of `call`, whose id is `call_id`): typed
 * wrappers, written once (in a file that includes op_shared.h).
 * OP_RECONCILE_STORE(prefix) lists them in its struct op_reconcile. */
#define OP_RECONCILE_STORE_HOOKS(prefix, store, row, call, call_id)                    \
    static void *prefix##_look_store_new(                                              \
        const char *url, const char *actor, const struct reconcile_limits *lim,        \
        const config_t *cfg, struct charged_error *err)                                \
    {                                                                                  \
        CHARGED_ASSERT(url &&actor &&lim &&cfg);                                       \
        return store##_new(url, actor, err);                                           \
    }                                                                                  \
    OP_RECONCILE_STORE_USE(prefix, store, row, call, call_id)

/* The same, for a store made by open(url, actor, lim, cfg, err): one that
 * claims a part of its records (attempt_store_new_of: a capture method's). */
#define OP_RECONCILE_STORE_HOOKS_OPENED(prefix, open, store, row, call, call_id)       \
    static void *prefix##_look_store_new(                                              \
        const char *url, const char *actor, const struct reconcile_limits *lim,        \
        const config_t *cfg, struct charged_error *err)                                \
    {                                                                                  \
        CHARGED_ASSERT(url &&actor &&lim &&cfg);                                       \
        return open(url, actor, lim, cfg, err);                                        \
    }                                                                                  \
    OP_RECONCILE_STORE_USE(prefix, store, row, call, call_id)

/* The hooks but store_new (OP_RECONCILE_STORE_HOOKS'). */
#define OP_RECONCILE_STORE_USE(prefix, store, row, call, call_id)                      \
    static void prefix##_look_store_free(void *st)                                     \
    {                                                                                  \
        store##_free(st);                                                              \
    }                                                                                  \
    static enum charged_rc prefix##_look_claim(                                        \
        void *st, void *due, size_t max, size_t *n, long long lease_ms,                \
        long long stale_ms, struct charged_error *err)                                 \
    {                                                                                  \
        CHARGED_ASSERT(st &&due &&n);                                                  \
        return store##_claim_due(st, due, max, n, lease_ms, stale_ms, err);            \
    }                                                                                  \
    static void prefix##_look_lease(const void *r, const char **id,                    \
                                    const int64_t **epoch)                             \
    {                                                                                  \
        const row *d = r;                                                              \
        CHARGED_ASSERT(d &&id &&epoch);                                                \
        *id = d->id;                                                                   \
        *epoch = &d->lease_epoch;                                                      \
    }                                                                                  \
    static enum charged_rc prefix##_look_renew(                                        \
        void *st, const char *const *ids, const int64_t *epochs, size_t n,             \
        long long lease_ms, int *still_ours, struct charged_error *err)                \
    {                                                                                  \
        return store##_renew(st, ids, epochs, n, lease_ms, still_ours, err);           \
    }                                                                                  \
    static enum charged_rc prefix##_look_hand_back(void *st, const char *const *ids,   \
                                                   const int64_t *epochs, size_t n,    \
                                                   struct charged_error *err)          \
    {                                                                                  \
        return store##_hand_back(st, ids, epochs, n, err);                             \
    }                                                                                  \
    static enum charged_rc prefix##_look_log_calls(                                    \
        void *st, const struct op_kept_call *calls, size_t n,                          \
        struct charged_error *err)                                                     \
    {                                                                                  \
        call *c = op_batch_new(n, sizeof(*c), err);                                    \
        if (!c)                                                                        \
            return CHARGED_RETRY;                                                      \
        CHARGED_ASSERT(calls || n == 0);                                               \
        for (size_t i = 0; i < n; i++)                                                 \
            c[i] = (call){.call_id = calls[i].id,                                      \
                          .operation = calls[i].operation,                             \
                          .started_ms = calls[i].started_ms,                           \
                          .res = calls[i].res,                                         \
                          .written_maybe = calls[i].written_maybe};                    \
        enum charged_rc rc = store##_log_calls(st, c, n, err);                         \
        free(c);                                                                       \
        return rc;                                                                     \
    }                                                                                  \
    static enum charged_rc prefix##_look_backlog(                                      \
        void *st, const enum attempt_status *statuses, size_t n, long long *counts,    \
        long long *oldest_ms, struct charged_error *err)                               \
    {                                                                                  \
        return store##_backlog(st, statuses, n, counts, oldest_ms, err);               \
    }

#define OP_RECONCILE_STORE(prefix)                                                     \
    .store_new = prefix##_look_store_new, .store_free = prefix##_look_store_free,      \
    .claim_due = prefix##_look_claim, .due_lease = prefix##_look_lease,                \
    .renew = prefix##_look_renew, .hand_back = prefix##_look_hand_back,                \
    .log_calls = prefix##_look_log_calls, .backlog = prefix##_look_backlog

/* ---- the api's webhook (worker/operations/webhook_store.c) ---- */

/* An operation's half of applying a provider's event: webhook_store
 * records the event once, in one transaction, and hands it to the first
 * operation of the table that takes it (webhook_apply.h: what the half
 * may use). */
struct op_webhook {
    /* Whether ev is about this operation's records. */
    int (*takes)(const struct webhook_event *ev);
    /* Applies ev on db, inside the open transaction: out's outcome,
     * reason, ids and statuses. CHARGED_OK, or the failure: the store
     * rolls back and the delivery is answered again. */
    enum charged_rc (*apply)(store_conn_t *db, const struct webhook_event *ev,
                             struct webhook_store_result *out,
                             struct charged_error *err);
};

/* ---- the api's status query (worker/roles/api.c) ---- */

/* GET <path><id> answers one record of the operation (a refund's, a
 * capture's): the api routes a path to the first operation whose path
 * begins it, checks that the id is a uuid and reads the row through
 * webhook_store_one (webhook_store.h). */
struct op_status {
    const char *path;                 /* "/v1/refunds/" */
    const char *id_name;              /* "refund_id": the log's field */
    const char *not_uuid, *not_found; /* the 400's and the 404's words */
    const char *help;                 /* `charged api --help`'s line */
    const char *sql;                  /* the row of $1::uuid, parameterized */
    /* That row as the api's object: column i is member fields[i]. */
    const struct webhook_store_field *fields;
    size_t nfields;
};

/* ---- the operation ---- */

struct payment_op {
    const char *name;         /* "charge": metrics' operation label, log lines */
    const char *command_type; /* the `type` its commands carry */
    /* The worker's stages (worker/operations/payment_ops.c routes the
     * commands topic to them). NULL: the worker routes none of its
     * commands; a message of its type is refused as of no known type. */
    const struct engine_op *engine;
    /* Its stages' provider call: the endpoint class (docs/provider.md,
     * budget_alloc.h: what its throttling is counted under and its budget
     * asked for) and the budget's priority of it. Every operation with
     * stages sets both (0 is a class and a priority too). */
    enum budget_class endpoint_class;
    enum budget_priority budget_priority;
    /* The reconciler's look. NULL: the reconciler claims none of its
     * records (none is left in doubt by a call). */
    const struct op_reconcile *reconcile;
    /* The api's provider events about its records. NULL: no event is its;
     * one that no operation takes is recorded, unmatched. */
    const struct op_webhook *webhook;
    /* The api's status query of its records. NULL: the api answers none
     * (a charge's attempts are the api's own routes). */
    const struct op_status *status;
    /* The auditor's rules about the provider's manual intents its steps
     * act on (audit_policy.h; chargectl audit run's too). NULL: none. */
    const struct audit_steps *audit;
    /* A person's decision on its records in REQUIRES_REVIEW
     * (step_review.h): `chargectl <noun> list|resolve` and the console's
     * queue. NULL: none of these (a charge's and a refund's reviews are
     * chargectl's and the console's own). */
    const struct step_review_kind *review;
    /* Its records of an attempt in the attempt's story (attempt_history.h:
     * `chargectl attempt show`, the console's timeline). NULL: none. */
    const struct attempt_history_steps *history;
    /* Its own settings (config.h's struct config_setting; NULL-ended),
     * added after the table's rows by payment_ops_add_settings. NULL:
     * none. */
    const struct config_setting *const *settings;
    /* chargectl publish's check of one command of its type, by its own
     * parser with chargectl's limits: DEAD_LETTER_NONE, or why and err.
     * NULL: none (a command of its type is judged as the table's first
     * operation's: chargectl publish's first guess, as the worker's). */
    enum dead_letter_reason (*check)(const char *id, size_t id_len, const char *value,
                                     size_t len,
                                     const struct charge_command_limits *lim,
                                     struct charged_error *err);
};

/* The table, in the order the roles walk it (the first is the worker's
 * first guess at a message: the charge). */
extern const struct payment_op *const payment_operations[];
extern const size_t payment_operations_count;

/* The operation of kind k (an index in the table). */
const struct payment_op *payment_op_of(size_t kind);

/* The reason an event of the provider's no operation of the table takes
 * is recorded with (webhook_store's unmatched), in the table's words. */
extern const char payment_ops_unmatched_reason[];

/* The audit rules of the table's operations, in its order, into *t. */
void payment_ops_audit_steps(struct audit_step_table *t);

/* Adds the table's operations' settings to the configuration
 * (config_add_settings): once, before any is read. 0, or -1 when too
 * many. */
int payment_ops_add_settings(void);

/* The history steps of the table's operations, in its order, into *t. */
void payment_ops_history(struct attempt_history_table *t);

/* The reviews of the table's operations into out (PAYMENT_OPS_MAX), in
 * its order: how many. */
size_t payment_ops_reviews(const struct step_review_kind **out);

/* The review whose noun is noun; NULL when none. */
const struct step_review_kind *payment_ops_review(const char *noun);

#endif
