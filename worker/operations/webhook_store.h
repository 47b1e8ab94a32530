/* webhook_store: what `charged api` reads and writes in PostgreSQL: the
 * provider's webhook events, recorded once each in processed_webhook_events
 * and the attempts they settle, and the status views.
 *
 * Webhook events are applied one transaction each: the event is recorded
 * in processed_webhook_events (PRIMARY KEY (provider, event_id)) first, so
 * that a concurrent or later delivery of the same event waits for, then
 * conflicts with, this one and changes nothing; then the first operation
 * of the table that takes the event applies it (op.h's struct op_webhook:
 * charge/charge_webhook.c, refund/refund_webhook.c,
 * authorize/authorize_webhook.c). For a charge (an authorization alike,
 * attempt_webhook.h) the attempt is locked
 * (FOR NO KEY UPDATE: a worker's provider-call rows for it are not held up),
 * the decision of webhook_event_decide() (an authorization's:
 * authorize_event_decide()) is taken on what is locked, and
 * the status change, its transition, its ledger row and its result event
 * are written before the commit. Nothing in the transaction waits on the
 * network but the database itself.
 *
 * A refund's event (refund.created, refund.updated, refund.failed, and
 * charge.refunded for each refund it lists) is recorded the same way; each
 * refund it names is found by its metadata refund_id, else by its provider
 * refund id, locked, decided by webhook_refund_decide() and, when it moves,
 * moved with its refund_transitions row and its result event; the
 * refund_attempts_money trigger applies the money. An event of several
 * refunds records the worst outcome of them (needs_review, unmatched,
 * applied, ignored).
 *
 * Status queries read attempts as the contract shows them, never their
 * payment method, metadata or secrets.
 *
 * Not thread-safe: one webhook_store per thread. The connection is opened
 * lazily and re-opened after it breaks. */
#ifndef CHARGED_WEBHOOK_STORE_H
#define CHARGED_WEBHOOK_STORE_H

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "store.h"
#include "webhook_event.h"

typedef struct webhook_store webhook_store_t;

/* Every fallible call returns an enum charged_rc (store.h) and fills err. */

/* Copies database_url. Does not connect: NULL and err only when it cannot
 * be parsed, or on out of memory. */
webhook_store_t *webhook_store_new(const char *database_url, struct charged_error *err);
void webhook_store_free(webhook_store_t *st);

/* What became of a webhook event. */
struct webhook_store_result {
    const char *outcome; /* "applied", "review", "ignored", "flagged",
                            "unmatched", "duplicate", or for a refund's
                            event "needs_review" */
    const char *reason;  /* static: why (the decision's) */
    char attempt_id[37]; /* "" when unmatched */
    char order_id[37];
    char old_status[20], new_status[20]; /* the attempt's, or the first
                                            matched refund's */
    char refund_id[37];                  /* the first matched refund; "" */
    size_t refunds_seen;                 /* refunds of the event decided */
};

/* Applies ev; `payload` is the event as stored for review (the JSON ev was
 * parsed from). `provider` names the provider in the deduplication key.
 * Returns CHARGED_OK; CHARGED_BAD_ITEM when the database refuses the event itself
 * (no delivery of it will ever be stored); anything else when the database
 * failed: nothing was changed and the delivery may be repeated (CHARGED_WAIT:
 * another session held the attempt past the 5 s lock_timeout; a value the
 * database refuses later in the transaction is CHARGED_RETRY, as the event
 * was fine). A connection found broken is replaced and the transaction
 * tried once more. */
enum charged_rc webhook_store_apply(webhook_store_t *st, const char *provider,
                                    const struct webhook_event *ev, const char *payload,
                                    struct webhook_store_result *out,
                                    struct charged_error *err);

/* Status queries. On success *out is a new reference the caller owns: one
 * attempt object, or {"order_id", "payment_attempts": [...]} oldest first.
 * Returns CHARGED_OK, CHARGED_NOT_FOUND when there is no such attempt or order
 * (*out NULL), anything else when the database failed. Ids must be
 * canonical lower-case uuids (the caller checks). */
enum charged_rc webhook_store_attempt(webhook_store_t *st, const char *attempt_id,
                                      json_t **out, struct charged_error *err);
enum charged_rc webhook_store_order(webhook_store_t *st, const char *order_id,
                                    json_t **out, struct charged_error *err);

/* A column of an operation's status query (op.h, struct op_status) as a
 * member of the api's object: its name and what its text becomes. A
 * column's NULL is JSON null whatever its kind. */
enum webhook_store_field_kind {
    WEBHOOK_FIELD_TEXT = 0, /* a JSON string */
    WEBHOOK_FIELD_INTEGER,  /* a JSON integer (minor units, counts) */
    WEBHOOK_FIELD_JSON      /* JSON text the query built (WEBHOOK_STORE_QUEUED) */
};
/* A column for a step's "queued" member (docs/api.md): its wait before the
 * call, {"reason", "since"}, read only while the claim that said it holds
 * (a worker that died waiting says nothing more); NULL otherwise. */
#define WEBHOOK_STORE_QUEUED                                                           \
    "CASE WHEN lease_expires_at > now() AND waiting_reason IS NOT NULL"                \
    " THEN json_build_object('reason', waiting_reason, 'since',"                       \
    "  to_char(waiting_since AT TIME ZONE 'UTC',"                                      \
    "          'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))::text END"
struct webhook_store_field {
    const char *name;
    enum webhook_store_field_kind kind;
};
/* One record of an operation: the one row sql reads for id ($1), its
 * column i the object's member fields[i]. As _attempt. */
enum charged_rc webhook_store_one(webhook_store_t *st, const char *sql, const char *id,
                                  const struct webhook_store_field *fields,
                                  size_t nfields, json_t **out,
                                  struct charged_error *err);

/* Is the database reachable? CHARGED_OK, or CHARGED_RETRY and err. */
enum charged_rc webhook_store_ping(webhook_store_t *st, struct charged_error *err);

#endif
