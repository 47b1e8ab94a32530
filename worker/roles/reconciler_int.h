/* reconciler_int: what the reconciler's two files share, no one else.
 *
 * reconciler.c is the role: its settings, the loop, the batches claimed
 * and their leases, the calls kept while the database is away.
 * reconciler_look.c is one look at a claimed record: the provider calls
 * reconcile_look (common/core) names, and the settlement written. What
 * differs between a look at a charge and at a refund is the operation's
 * (op.h's struct op_reconcile, in its folder): their calls, their store,
 * the words of their log lines. Both walk the table of operations. */
#ifndef CHARGED_RECONCILER_INT_H
#define CHARGED_RECONCILER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "daemon.h"
#include "op.h"
#include "provider_client.h"

#define MAX_SCHEDULE 32
/* Calls waiting for the database after a failed write, at most. */
#define PENDING_MAX 64

struct reconciler {
    config_t *cfg;
    char id[160];
    /* Per kind (an index in the table of operations), for those with a
     * reconciler's face: its store, and its batch's rows (due_size each). */
    void *stores[PAYMENT_OPS_MAX];
    void *due[PAYMENT_OPS_MAX];
    provider_client_t *provider;
    struct daemon_budget budget; /* its look-ups draw from the fleet's */
    long long batch, lease_ms, poll_ms, max_age_ms, search_lag_ms, stale_ms;
    long long key_retention_ms, provider_timeout_ms;
    long long schedule[MAX_SCHEDULE];
    int nschedule;
    int64_t next_poll, next_backlog;
    struct daemon_db db;
    size_t on;            /* the kind of the batch claimed */
    size_t ndue, looking; /* the batch claimed, and the one looked at */
    int64_t renewed_at;   /* when the batch's leases were last extended */
    /* Issue 38: a 429 slows the reconciler. The last look's wait when a
     * 429 ended it (0: none): the record and the rest of the batch wait
     * it out; and how many looks in a row a 429 ended (the back-off when
     * the provider gives no Retry-After). */
    long long throttled_ms;
    int throttled_in_a_row;
    /* The provider's object of the last look (op_look_start.object, into
     * the batch's row; NULL: none): look_at_batch tells a 429 about one
     * object from the account's by it. */
    const char *look_object;
    /* The object a 429 of this batch was about first (into its row; NULL:
     * none): its other records are handed back unlooked (look_skipped). */
    const char *skip_object;
    int look_skipped;
    struct pending_call {
        char attempt_id[37]; /* or the refund's id */
        size_t kind;
        const char *operation; /* a string literal */
        int64_t started_ms;
        struct provider_result res;
        int written_maybe; /* a write of it failed, and may yet commit */
    } pending[PENDING_MAX];
    size_t npending;
};

/* ---- reconciler.c ---- */

/* A database step failed (logged, counted, backed off), or succeeded. */
void reconciler_db_failed(struct reconciler *r, const char *stage, const char *err);
void reconciler_db_ok(struct reconciler *r);
/* Extends the batch's leases once a third of a lease has passed. */
void reconciler_keep_leases(struct reconciler *r);
/* Keeps the rows of a look whose settlement was not written, to write them
 * later: a charge or a refund made must never vanish from provider_calls.
 * id_key: the log field of id. */
void reconciler_keep_calls(struct reconciler *r, size_t kind, const char *id,
                           const char *id_key, const struct op_call_row *rows,
                           size_t n);
/* The reconciler's face of the operation of kind k (never NULL: the
 * reconciler claims only the records of those that have one). */
const struct op_reconcile *reconciler_face(size_t k);
/* The i-th row of the batch claimed. */
const void *reconciler_row(const struct reconciler *r, size_t i);

/* ---- reconciler_look.c ---- */

/* Looks at the i-th record of the batch (of kind r->on),
 * claimed at claimed_at (clock_now_ms), and settles it; sets
 * r->throttled_ms. -1 when the round stops here (the database failed). */
int reconciler_look_at(struct reconciler *r, size_t i, int64_t claimed_at);

#endif
