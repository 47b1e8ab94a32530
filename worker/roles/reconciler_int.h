/* reconciler_int: what the reconciler's two files share, no one else.
 *
 * reconciler.c is the role: its settings, the loop, the batches claimed
 * and their leases, the calls kept while the database is away.
 * reconciler_look.c is one look at a claimed record: the provider calls
 * reconcile_look (common/core) names, and the settlement written. What
 * differs between a look at a charge and at a refund is one table each
 * (struct look_kind): their calls, their store, the words of their log
 * lines. */
#ifndef CHARGED_RECONCILER_INT_H
#define CHARGED_RECONCILER_INT_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_store.h"
#include "config.h"
#include "daemon.h"
#include "provider_client.h"
#include "refund_store.h"

#define MAX_SCHEDULE 32
/* Calls waiting for the database after a failed write, at most. */
#define PENDING_MAX 64

struct reconciler {
    config_t *cfg;
    char id[160];
    attempt_store_t *store;
    refund_store_t *refunds;
    provider_client_t *provider;
    long long batch, lease_ms, poll_ms, max_age_ms, search_lag_ms, stale_ms;
    long long key_retention_ms, provider_timeout_ms;
    long long schedule[MAX_SCHEDULE];
    int nschedule;
    int64_t next_poll, next_backlog;
    struct daemon_db db;
    struct attempt_due *due;
    struct refund_due *rdue;
    int on_refunds;       /* the batch is of refunds (rdue), not attempts */
    size_t ndue, looking; /* the batch claimed, and the one looked at */
    int64_t renewed_at;   /* when the batch's leases were last extended */
    struct pending_call {
        char attempt_id[37]; /* or the refund's id */
        int refund;
        const char *operation; /* a string literal */
        int64_t started_ms;
        struct provider_result res;
        int written_maybe; /* a write of it failed, and may yet commit */
    } pending[PENDING_MAX];
    size_t npending;
};

/* One call of a look as provider_calls records it. */
struct look_row {
    const char *operation; /* a string literal */
    int64_t started_ms;    /* epoch ms */
    const struct provider_result *res;
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
void reconciler_keep_calls(struct reconciler *r, int refund, const char *id,
                           const char *id_key, const struct look_row *rows, size_t n);

/* ---- reconciler_look.c ---- */

/* Looks at the i-th record of the batch (a refund when r->on_refunds),
 * claimed at claimed_at (clock_now_ms), and settles it. -1 when the round
 * stops here (the database failed). */
int reconciler_look_at(struct reconciler *r, size_t i, int64_t claimed_at);

#endif
