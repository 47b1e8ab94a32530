/* engine: the at-most-once pipeline every money-moving operation runs on.
 *
 * A command message is taken from Kafka, parsed (or dead-lettered),
 * recorded, claimed under a fenced lease, sent to the provider with the
 * record's stable idempotency key while that key is surely still kept,
 * persisted fenced on the lease, and only then is its offset committed. The
 * engine owns all of that: batches and their one-item-at-a-time fallback,
 * leases and their renewal, fencing, hand-back, the key window, the
 * provider breaker, dead letters, rebalances and the drain. See
 * docs/worker.md and docs/architecture.md.
 *
 * What differs between operations sits behind a struct engine_op: how a
 * command is parsed, the statements that record, claim and settle its
 * record, the provider request, and the events a settlement publishes. The
 * charge is one (charge_op.h); a second operation is a second descriptor,
 * and the engine's loop does not change for it. */
#ifndef CHARGED_ENGINE_H
#define CHARGED_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_status.h"
#include "budget_alloc.h"
#include "config.h"
#include "daemon.h"
#include "dead_letter_reason.h"
#include "engine_core.h"
#include "provider_client.h"
#include "store.h"

/* ---- what an operation's store answers (its results: engine_core.h) ---- */

struct engine_record {
    const void *command;              /* in: the op's parsed command */
    void *params;                     /* in: op->params_size bytes to fill */
    enum engine_record_result result; /* out */
    char reason[160];                 /* out: conflict or rejection */
    int64_t lease_epoch;              /* out, when claimed (the key's age is 0:
                                         never sent) */
};

struct engine_claim {
    const char *id;                  /* in: the record's id */
    int kind;                        /* in: its kind_of */
    void *params;                    /* in: op->params_size bytes to fill */
    enum engine_claim_result result; /* out */
    int64_t lease_epoch;             /* out, when claimed */
    int64_t key_age_ms;              /* out, when claimed: now - first sent, on
                                        the database's clock; 0 never sent */
    char status[20];                 /* out: the status before the claim */
    char rejected[160];              /* out, when SETTLED: why this claim
                                        rejected it before any call ("" when
                                        it was settled before) */
};

/* A provider call, for the record's call log. */
struct engine_call {
    const char *id;
    int kind;           /* the record's kind_of */
    int64_t started_ms; /* epoch ms */
    const struct provider_result *res;
    /* An earlier write of this call failed and may still commit (a
     * statement given up at its deadline can run later): the store writes
     * it only if the same call's row is not there yet. */
    int written_maybe;
};

/* An outcome, persisted fenced on the lease together with the record's
 * transition, its event and its ledger row. */
struct engine_outcome {
    const char *id;            /* in */
    int kind;                  /* in: the record's kind_of */
    int64_t lease_epoch;       /* in: the claim this result belongs to */
    const char *status;        /* in: SUCCEEDED, FAILED, UNKNOWN, ... */
    const char *reason;        /* in, may be NULL */
    const char *provider_id;   /* in, may be NULL: the provider's object */
    const char *event_type;    /* in: result event, NULL for none */
    const char *evidence_json; /* in: the provider's answer, summarised */
    int calls;                 /* in: provider calls under this claim */
    const char *last_error;    /* in, may be NULL */
    long long next_check_ms;   /* in: reconciler's next look; < 0 none */
    int persisted;             /* out: 0 when the lease was lost */
    int busy;                  /* out: another session holds the row: nothing written */
};

/* ---- the descriptor ---- */

/* Every store function takes a batch in one round trip, returns an enum
 * charged_rc and fills err, and is safe to repeat (store.h): CHARGED_BAD_ITEM and
 * CHARGED_WAIT make the engine try the items one at a time. */
struct engine_op {
    const char *name; /* "charge": metrics' operation label, log lines */
    /* The command topic and its dead-letter topic (enum config_key). */
    unsigned commands_topic_key, dlq_topic_key;
    size_t command_size; /* bytes of a parsed command, kept per job */
    size_t params_size;  /* bytes of what a claim says to send */

    /* The operation's own state (its store, its limits), from the role's
     * configuration; NULL and err when it cannot be built. */
    void *(*open)(config_t *cfg, const char *actor, struct charged_error *err);
    void (*close)(void *op);

    /* A message's key and value: DEAD_LETTER_NONE and *command filled (its
     * resources freed by release), or a reason and one line in err. */
    enum dead_letter_reason (*parse)(void *op, const void *key, size_t key_len,
                                     const void *value, size_t value_len, void *command,
                                     struct charged_error *err);
    void (*release)(void *command);
    /* The record's id (the lease's name) and the order it is for. */
    const char *(*id_of)(const void *command);
    const char *(*order_of)(const void *command);

    enum charged_rc (*ping)(void *op, struct charged_error *err);
    /* An operation may claim the records it creates, under a lease of
     * lease_ms (ENGINE_RECORDED_CLAIMED), saving their claim statement. */
    enum charged_rc (*record)(void *op, struct engine_record *items, size_t n,
                              long long lease_ms, struct charged_error *err);
    enum charged_rc (*claim)(void *op, struct engine_claim *items, size_t n,
                             long long lease_ms, struct charged_error *err);
    enum charged_rc (*log_calls)(void *op, const struct engine_call *calls, size_t n,
                                 struct charged_error *err);
    enum charged_rc (*persist)(void *op, struct engine_outcome *items, size_t n,
                               struct charged_error *err);
    enum charged_rc (*renew)(void *op, const char *const *ids, const int *kinds,
                             const int64_t *epochs, size_t n, long long lease_ms,
                             int *still_ours, struct charged_error *err);
    enum charged_rc (*release_leases)(void *op, const char *const *ids,
                                      const int *kinds, const int64_t *epochs, size_t n,
                                      struct charged_error *err);
    /* Says on the records of claims of ours that they wait before their
     * call, or that the wait ended (store.h's struct store_wait; its kind
     * is the item's): one UPDATE per batch, fenced on each claim. A hint:
     * whatever ends the claim ends it too (migration 0021). */
    enum charged_rc (*wait)(void *op, const struct store_wait *items, size_t n,
                            struct charged_error *err);

    /* Starts the provider call for the claimed params (never the message's
     * copy) under their idempotency key; `tag` comes back with its answer
     * from provider_client_next_done. CHARGED_OK, or the provider
     * client's code (CHARGED_BAD_ITEM, CHARGED_RETRY) and err: nothing
     * started. */
    enum charged_rc (*start_call)(void *op, provider_client_t *pc, const void *params,
                                  const void *command, void *tag,
                                  struct charged_error *err);
    /* The provider's object a record of `kind` calls about (its payment
     * method, its payment intent), from the claimed params; "" or NULL:
     * none. A 429 about one object is told from the account's rate by it
     * (provider_pace.h). */
    const char *(*object_of)(int kind, const void *params);
    /* The event a record of `kind` entering `status` publishes, or NULL
     * for none. */
    const char *(*event_type)(int kind, enum attempt_status status);
    /* Whether a record of `kind` the provider keeps throttling may be set
     * aside: persisted PROCESSING, unleased, for the reconciler, which
     * claims it when its next look is due and sends it again under its
     * key (engine_core.h, ENGINE_SET_ASIDE_AFTER_MS). Only for an
     * operation whose look does so. NULL: none may; it stays parked. */
    int (*sets_aside)(int kind);
    /* What follows a provider's answer to a record of `kind`: settle it
     * (status, first look, reason code) or send again
     * (engine_decide_fn). The engine counts the tries, keeps the key
     * window and applies the decision. */
    engine_decide_fn decide;
    /* What a settled answer's outcome says: its reason into reason ("" for
     * none), *provider_id (the provider's object, "" for none), and its
     * evidence as compact JSON, which the engine frees (NULL: out of
     * memory). calls: provider calls under the claim. */
    char *(*outcome)(int kind, const struct provider_result *res,
                     const struct answer_decision *d, int calls, char *reason,
                     size_t reason_size, const char **provider_id);

    /* Operations that share one command topic (a charge and its refunds)
     * are one descriptor that routes each item by its kind: which
     * operation a parsed command is (NULL: always 0). The kind comes back
     * in every item and lease call. */
    int (*kind_of)(const void *command);
    /* A kind's name, for metrics' operation label and log lines (NULL:
     * name), and the log field its id is (NULL: "payment_attempt_id"). */
    const char *(*kind_name)(int kind);
    const char *(*id_field)(int kind);
    /* The counter of a kind's settled records, by status (enum
     * metric_id; NULL: charged_attempts_processed_total). */
    unsigned (*outcomes_metric)(int kind);
    /* A kind's provider call: its endpoint class (docs/provider.md: what
     * its throttling is counted under and its budget asked for) and the
     * budget's priority of it, into *cls and *prio (NULL: a create, at a
     * charge's priority). */
    void (*budget_of)(int kind, enum budget_class *cls, enum budget_priority *prio);
};

typedef struct engine engine_t;

/* Builds the engine for `op` from cfg (taking ownership of cfg, also on
 * failure) and sets *out. CHARGED_OK, or with err CHARGED_GIVE_UP (a bad
 * configuration) or CHARGED_RETRY (a runtime failure: out of memory, Kafka
 * refused the subscription). The rest is a role of the daemon's
 * (daemon.h): */
enum charged_rc engine_start(config_t *cfg, const char *id, const struct engine_op *op,
                             engine_t **out, struct charged_error *err);
/* One turn of the pipeline; DAEMON_NOW (it waits inside, in the polls
 * that its events wake). */
int64_t engine_step(engine_t *eng, int64_t now);
/* "database unreachable", "kafka denies <operation> on <resource>", "no
 * partitions assigned", "provider breaker open", or NULL when ready. */
const char *engine_not_ready(engine_t *eng);
/* Takes nothing new and finishes what it holds until `deadline`; gives up
 * the rest (uncommitted). Returns how many messages were left. */
size_t engine_drain(engine_t *eng, int64_t deadline);
/* Commits what finished, leaves the group, frees everything. */
void engine_finish(engine_t *eng, int flush_ms);

#endif
