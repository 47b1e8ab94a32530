/* sim_provider: a model of the payment provider (docs/provider.md, and
 * psp-sim's faults): idempotency keys kept for a retention and then
 * forgotten, a search that lags behind fresh intents, a consistent list,
 * answers lost after the call executed, declines, errors before and after
 * executing, intents that settle later (processing), webhooks delivered
 * late, twice and out of order, and a ledger of what it actually charged
 * and refunded: the invariants are counted from that ledger, never from
 * charged's own books. The structs are open: the checker reads them. */
#ifndef CHARGED_SIM_PROVIDER_H
#define CHARGED_SIM_PROVIDER_H

#include <stddef.h>
#include <stdint.h>

#include "provider_outcome.h"
#include "sim_rng.h"
#include "sim_world.h"

enum sim_intent_state {
    SIM_INTENT_PROCESSING,
    SIM_INTENT_SUCCEEDED,
    SIM_INTENT_FAILED,
    SIM_INTENT_REQUIRES_CAPTURE, /* a manual intent holds the money */
    SIM_INTENT_CANCELED          /* a manual intent released by our cancel */
};

struct sim_intent {
    int key, attempt, order;
    long long amount;
    enum sim_intent_state state;
    int final_success;           /* PROCESSING: how it will end */
    int64_t created, visible_at; /* visible_at: when the search sees it */
    int64_t settle_at;           /* PROCESSING: when it ends */
    long long refunded;          /* executed refunds */
    int next_of_attempt;         /* the attempt's next intent, or -1 */
    int manual;                  /* capture_method manual: an authorization */
    long long captured;          /* manual: amount_received (the ledger's) */
    int capture_key, void_key;   /* manual: the step keys that captured or
                                    canceled it; -1 none */
};

struct sim_prefund {
    int key, intent, refund;
    long long amount;
    int64_t created;
};

/* A provider key (one namespace per kind here: charge keys and refund keys
 * never collide in the generator). */
struct sim_pkey {
    int64_t first_post; /* -1: never posted */
    int stored;         /* an answer is kept for replay */
    int64_t stored_at;
    int object;         /* the intent (or refund) the stored answer names */
    int outcome;        /* the stored answer's enum provider_outcome */
    int64_t busy_until; /* a request under the key executes until then: 409 */
};

/* SIM_EV_REFUND: a refund succeeded (refund.updated); intent is then the
 * provider's refund. */
/* SIM_EV_AUTHORIZED: payment_intent.amount_capturable_updated (a hold). */
enum sim_evidence {
    SIM_EV_SUCCEEDED,
    SIM_EV_FAILED,
    SIM_EV_PROCESSING,
    SIM_EV_REFUND,
    SIM_EV_AUTHORIZED
};

struct sim_webhook {
    int event_id, intent;
    enum sim_evidence evidence;
    int64_t created, deliver_at;
};

struct sim_provider {
    const struct sim_settings *set;
    struct sim_rng *rng;
    struct sim_violation *viol;
    int64_t now;

    struct sim_intent *intents;
    size_t nintents, capintents;
    struct sim_prefund *refunds;
    size_t nrefunds, caprefunds;
    struct sim_pkey *keys, *rkeys; /* charge keys, refund keys, by id */
    size_t nkeys, nrkeys;
    struct sim_pkey *skeys; /* capture and void keys, by id */
    size_t nskeys;
    int *first_of_attempt; /* by attempt id: its first intent, or -1 */
    size_t nattempts;

    /* The ledger: what actually moved. */
    int *charges_by_key; /* by charge key */
    size_t ncharge_keys;
    unsigned char *refund_executed; /* by charged's refund id */
    size_t nrefund_executed;
    int *charges_by_order; /* by order */
    size_t norders;
    long long charged_total, refunded_total;
    long long captured_total; /* of it, what captures took */
    uint64_t captures, voids; /* executed */
    uint64_t in_use;          /* 409s answered */
    uint64_t throttled;       /* 429s answered */
    int64_t storm_until;      /* every POST is throttled until then (a
                                 fleet over the account's rate limit) */
    int *processing;          /* intents still processing */
    size_t nprocessing, capprocessing;

    struct sim_webhook *hooks;
    size_t nhooks, caphooks;
    int next_event;
    /* Called when an intent of `attempt` moves money (the checker looks
     * at that attempt's stored status). */
    void (*on_charge)(void *ctx, int attempt);
    void *ctx;
};

struct sim_provider *sim_provider_new(const struct sim_settings *set,
                                      struct sim_rng *rng, struct sim_violation *viol);
void sim_provider_free(struct sim_provider *p);

/* Intents that settle now, and their webhooks. */
void sim_provider_tick(struct sim_provider *p);

/* Every POST first meets the rate limit: a random 429 now and then, and
 * storms (a few seconds in which every POST is answered 429, with a
 * Retry-After or without): not executed, throttled. */

/* POST /v1/payment_intents under `key`. The answer takes latency_ms;
 * *lost: it never arrives, the caller times out. A second request while
 * the first under the key executes is answered 409 (not executed). */
struct provider_result sim_provider_charge(struct sim_provider *p, int key, int attempt,
                                           int order, long long amount, int manual,
                                           int *lost);
/* POST /v1/payment_intents/<intent>/capture (amount 0: all it holds) and
 * .../cancel under a step's key, psp-sim's manual capture: one capture per
 * intent, amount_to_capture <= amount_capturable, a cancel of a
 * requires_capture intent only; otherwise 400
 * payment_intent_unexpected_state, which charged must never have asked
 * for: the invariants one-capture-per-authorization, capture-after-void
 * and captured-within-authorized fire at such a request. */
struct provider_result sim_provider_capture(struct sim_provider *p, int key, int intent,
                                            long long amount, int *lost);
struct provider_result sim_provider_cancel(struct sim_provider *p, int key, int intent,
                                           int *lost);
/* GET by id; search by metadata[payment_attempt_id]; the list of the
 * attempt's intents created in [gte, lt) unix seconds (consistent). */
struct provider_result sim_provider_retrieve(struct sim_provider *p, int intent);
struct provider_result sim_provider_search(struct sim_provider *p, int attempt);
struct provider_result sim_provider_list(struct sim_provider *p, int attempt,
                                         long long gte, long long lt);

/* POST /v1/refunds under `key`, of `intent`; refunds with that refund id
 * in the intent's list; GET of a refund. */
struct provider_result sim_provider_refund(struct sim_provider *p, int key, int intent,
                                           int refund, long long amount, int *lost);
struct provider_result sim_provider_list_refunds(struct sim_provider *p, int intent,
                                                 int refund);
struct provider_result sim_provider_retrieve_refund(struct sim_provider *p,
                                                    int prefund);

/* Takes one webhook due for delivery, chosen at random (so reordered);
 * 0 when none is due. */
int sim_provider_next_webhook(struct sim_provider *p, struct sim_webhook *out);

/* "a12", "pi_7", "re_3": the ids as strings. */
void sim_attempt_name(int attempt, char *buf, size_t size);

uint64_t sim_provider_hash(const struct sim_provider *p, uint64_t h);

#endif
