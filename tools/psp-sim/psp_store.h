/* psp_store: the simulated provider's state — idempotency keys, payment
 * intents and the ledger of every charge and cancel it actually executed.
 *
 * Semantics follow Stripe's idempotent requests: a key is reserved while its
 * first request executes (a second one meanwhile gets 409), its answer is
 * stored once executed and replayed to any later request with the same
 * parameters, refused (400 idempotency_error) with other parameters, and
 * forgotten after the retention period. Requests that fail validation are
 * answered 400 and not stored. Thread-safe: one lock guards everything. */
#ifndef PSP_STORE_H
#define PSP_STORE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct psp_store psp_store_t;

/* A parsed POST /v1/payment_intents. Strings are owned by the caller. */
struct psp_charge_request {
    const char *idempotency_key; /* NULL: not idempotent */
    const char *amount;          /* as sent; validated by the store */
    const char *currency;
    const char *payment_method;
    const char *confirm;
    const char *capture_method;      /* NULL or automatic; manual: authorize */
    const char *payment_attempt_id;  /* metadata[payment_attempt_id] */
    const char *order_id;            /* metadata[order_id] */
    const char *customer;            /* NULL, or must look like cus_<alnum> */
    const char *apm_enabled;         /* automatic_payment_methods[enabled] */
    const char *apm_allow_redirects; /* automatic_payment_methods[allow_redirects] */
    const char *body;                /* the raw form body: fingerprinted, so every
                                        parameter (customer included) counts */
};

/* What a request resolved to. `body` is owned by the caller (free()). */
struct psp_answer {
    int status;   /* HTTP status */
    char *body;   /* JSON */
    int replayed; /* Idempotent-Replayed: true */
};

enum psp_begin {
    PSP_BEGIN_EXECUTE = 0, /* key reserved (or none): call psp_store_execute */
    PSP_BEGIN_ANSWERED,    /* answer filled in: replay, 409, 400 */
};

psp_store_t *psp_store_new(int64_t retention_ms);
void psp_store_free(psp_store_t *st);

void psp_store_set_retention(psp_store_t *st, int64_t retention_ms);
/* Search finds an intent only search_lag_ms after its creation (0: at once);
 * retrieve by id always does. Applies to every intent, old ones included. */
void psp_store_set_search_lag(psp_store_t *st, int64_t search_lag_ms);
/* settle_ms > 0: a processing intent has succeeded settle_ms after its
 * creation (settled when next read); 0: only POST /intents/<id>/settle does. */
void psp_store_set_processing_settle(psp_store_t *st, int64_t settle_ms);

/* Called each time an intent enters a status: when it is created (succeeded,
 * processing, requires_capture or requires_payment_method), when it settles,
 * when it is captured and when it is canceled (by a client, or by its
 * authorization's expiry). `intent` is the intent as retrieve answers it, borrowed;
 * at_ms is when the change happened. It runs under the store's lock, so calls for one
 * intent come in the order of its changes: serialise the intent, do not keep it, do not
 * block, do not call back into the store. NULL: nobody is told. */
typedef void (*psp_store_observer_fn)(void *ctx, json_t *intent, int64_t at_ms);
void psp_store_set_observer(psp_store_t *st, psp_store_observer_fn fn, void *ctx);

/* Settles every processing intent whose --processing-settle-ms has passed
 * and expires every authorization whose expiry has passed (as reading it
 * would, as of when it was due), so that its change is observed without
 * anyone reading it. Returns the ms until the next one is
 * due, or -1 when none is waiting. */
int64_t psp_store_settle_due(psp_store_t *st, int64_t now_ms);

/* Validates the request and takes its key. On PSP_BEGIN_EXECUTE the caller
 * must end with psp_store_execute() or psp_store_release(). */
enum psp_begin psp_store_begin(psp_store_t *st, const struct psp_charge_request *req,
                               int64_t now_ms, struct psp_answer *ans);

/* Executes the charge: creates the payment intent, books it in the ledger,
 * stores the answer under the key. */
void psp_store_execute(psp_store_t *st, const struct psp_charge_request *req,
                       int64_t now_ms, struct psp_answer *ans);

/* A parsed POST /v1/payment_intents/<id>/cancel. Strings are owned by the
 * caller. */
struct psp_cancel_request {
    const char *idempotency_key;     /* NULL: not idempotent */
    const char *payment_intent_id;   /* from the URL */
    const char *cancellation_reason; /* NULL: none */
    const char *unknown_parameter;   /* the first form name that is none of
                                        the above: refused; NULL when none */
    const char *body;                /* the raw form body: fingerprinted */
};

/* As psp_store_begin, for a cancel; a key belongs to the endpoint it was
 * first used on (POST /v1/payment_intents, or this intent's cancel), so a
 * charge's key on a cancel, or a cancel's on a charge, is 400
 * idempotency_error. Refused, and not stored under the key: an unknown
 * parameter or cancellation_reason (400), an unknown intent (404
 * resource_missing), an intent whose status is no cancelable one
 * (requires_payment_method, requires_capture, requires_confirmation,
 * requires_action, processing): 400 payment_intent_unexpected_state, the
 * intent in error.payment_intent. On PSP_BEGIN_EXECUTE the caller must end
 * with psp_store_cancel_execute() or psp_store_release(). */
enum psp_begin psp_store_cancel_begin(psp_store_t *st,
                                      const struct psp_cancel_request *req,
                                      int64_t now_ms, struct psp_answer *ans);

/* Executes the cancel: the intent becomes canceled (canceled_at,
 * cancellation_reason), its charge's ledger row's outcome canceled (a
 * processing one settles), the cancel is booked in the ledger's cancels and
 * its answer (200, the intent) stored under the key. Returns 1; 0 when the
 * intent is no longer cancelable (it settled while the cancel waited): *ans
 * is then the refusal begin would give, the key is given back and nothing
 * is booked. */
int psp_store_cancel_execute(psp_store_t *st, const struct psp_cancel_request *req,
                             int64_t now_ms, struct psp_answer *ans);

/* A parsed POST /v1/payment_intents/<id>/capture. Strings are owned by the
 * caller. */
struct psp_capture_request {
    const char *idempotency_key;   /* NULL: not idempotent */
    const char *payment_intent_id; /* from the URL */
    const char *amount_to_capture; /* NULL: all of amount_capturable */
    const char *unknown_parameter; /* the first other form name: refused */
    const char *body;              /* the raw form body: fingerprinted */
};

/* As psp_store_cancel_begin, for a capture (its key belongs to this
 * intent's capture). Refused, and not stored under the key: an unknown
 * parameter or an amount_to_capture that is no positive integer (400), an
 * unknown intent (404 resource_missing), an intent that is not
 * requires_capture (captured, canceled, expired, never authorized): 400
 * payment_intent_unexpected_state, an amount_to_capture beyond
 * amount_capturable: 400 amount_too_large; both with the intent in
 * error.payment_intent. On PSP_BEGIN_EXECUTE end with
 * psp_store_capture_execute() or psp_store_release(). */
enum psp_begin psp_store_capture_begin(psp_store_t *st,
                                       const struct psp_capture_request *req,
                                       int64_t now_ms, struct psp_answer *ans);

/* Executes the capture: the intent becomes succeeded with amount_received
 * the amount captured and amount_capturable 0 (the rest is released); its
 * charge row's outcome becomes succeeded with that amount; the capture is
 * booked in the ledger's captures and its answer (200, the intent) stored
 * under the key. Returns 1; 0 when it is no longer allowed (the intent was
 * canceled or expired while the capture waited): *ans is the refusal, the
 * key given back, nothing booked. */
int psp_store_capture_execute(psp_store_t *st, const struct psp_capture_request *req,
                              int64_t now_ms, struct psp_answer *ans);

/* An authorization (requires_capture) older than expiry_ms is canceled by
 * the provider, cancellation_reason automatic: seen by the next read or
 * write of it, or by psp_store_settle_due. Default 7 days. */
#define PSP_AUTHORIZATION_EXPIRY_MS 604800000LL
/* At most a year: longer than any card network holds an authorization. */
#define PSP_AUTHORIZATION_EXPIRY_MAX_MS 31536000000LL
void psp_store_set_authorization_expiry(psp_store_t *st, int64_t expiry_ms);

/* Gives the key back without executing (a fault before executing). */
void psp_store_release(psp_store_t *st, const char *idempotency_key);

/* GET /v1/payment_intents/<id>: 200, or 404 resource_missing. */
void psp_store_retrieve(psp_store_t *st, const char *id, int64_t now_ms,
                        struct psp_answer *ans);

/* GET /v1/payment_intents/search by metadata['payment_attempt_id']. */
void psp_store_search(psp_store_t *st, const char *payment_attempt_id, int64_t now_ms,
                      struct psp_answer *ans);

/* GET /v1/payment_intents: Stripe's list, which is consistent (no search
 * lag): intents created in [created_gte, created_lt) (unix seconds, as
 * `created`), of `customer` when given, newest first (by created, then by
 * creation), at most `limit`, those after `starting_after` (an intent id,
 * a deleted one's included) when given; `has_more` says whether another
 * page follows. 400 resource_missing for an unknown starting_after. A page
 * is one pass over the intents keeping the limit + 1 newest. */
struct psp_list_query {
    int64_t created_gte, created_lt; /* INT64_MIN / INT64_MAX: unbounded */
    int limit;                       /* 1..100 */
    const char *starting_after;      /* NULL: from the newest */
    const char *customer;            /* NULL: any */
};
void psp_store_list(psp_store_t *st, const struct psp_list_query *q, int64_t now_ms,
                    struct psp_answer *ans);

/* How a processing intent settles. Strings are owned by the caller. */
struct psp_settlement {
    const char *status;       /* succeeded, requires_payment_method, canceled */
    const char *decline_code; /* requires_payment_method only; NULL: generic_decline */
};

/* {"status":"requires_payment_method","decline_code":"insufficient_funds"}
 * -> *out (its strings point into body). 0 / -1 with errbuf. */
int psp_settlement_parse(json_t *body, struct psp_settlement *out, char *errbuf,
                         size_t errbuf_size);

/* Moves a processing intent to set->status, and its ledger row's outcome
 * with it (succeeded, declined or canceled; settled_at_ms set): 200 with the
 * intent, 404 resource_missing, 409 when it is not processing. A replay
 * under the charge's key still answers what the create did, as Stripe's. */
void psp_store_settle(psp_store_t *st, const char *id, const struct psp_settlement *set,
                      int64_t now_ms, struct psp_answer *ans);

/* ---- refunds (POST /v1/refunds), with Stripe's semantics ---- */

/* Settle delay of pending refunds: settle_ms > 0: a pending refund reaches
 * the end its intent's payment method gives it (succeeded, or failed for
 * pm_card_refundPendingFail) settle_ms after its creation, when next read or
 * by psp_store_settle_due; 0: only psp_store_refund_settle does. */
void psp_store_set_refund_settle(psp_store_t *st, int64_t settle_ms);

/* Called for each refund event, under the store's lock and in the order of
 * the changes: type refund.created, refund.updated, refund.failed (object:
 * the refund) or charge.refunded (object: the intent's charge with its
 * amount_refunded and refunds). Rules as psp_store_observer_fn. */
typedef void (*psp_store_event_fn)(void *ctx, const char *type, json_t *object,
                                   int64_t at_ms);
void psp_store_set_event_observer(psp_store_t *st, psp_store_event_fn fn, void *ctx);

/* A parsed POST /v1/refunds. Strings and metadata are owned by the
 * caller. */
struct psp_refund_request {
    const char *idempotency_key;   /* NULL: not idempotent */
    const char *payment_intent;    /* required */
    const char *amount;            /* NULL: what is left of the intent */
    const char *reason;            /* NULL, duplicate, fraudulent,
                                      requested_by_customer */
    json_t *metadata;              /* object of metadata[...] strings */
    const char *unknown_parameter; /* the first other form name: refused */
    const char *body;              /* the raw form body: fingerprinted */
};

/* As psp_store_begin, for a refund (its key belongs to /v1/refunds).
 * Refused and not stored under the key: bad parameters (400), an unknown
 * intent (404 resource_missing), an intent that is not succeeded (400
 * charge_not_refundable), nothing left to refund (400
 * charge_already_refunded), an amount beyond what is left, the intent's
 * amount less its refunds that have not failed (400 amount_too_large). On
 * PSP_BEGIN_EXECUTE end with psp_store_refund_execute or psp_store_release. */
enum psp_begin psp_store_refund_begin(psp_store_t *st,
                                      const struct psp_refund_request *req,
                                      int64_t now_ms, struct psp_answer *ans);

/* Executes the refund: 200 with the refund, whose status follows the
 * intent's payment method (pm_card_refundPending, pm_card_refundPendingFail:
 * pending; pm_card_refundFail: failed, failure_reason lost_or_stolen_card;
 * any other: succeeded); booked in the ledger's refunds, stored under the
 * key. Returns 1; 0 when it is no longer allowed (another refund took what
 * was left meanwhile): *ans is the refusal, the key given back. */
int psp_store_refund_execute(psp_store_t *st, const struct psp_refund_request *req,
                             int64_t now_ms, struct psp_answer *ans);

/* GET /v1/refunds/<id>: 200, or 404 resource_missing. */
void psp_store_refund_retrieve(psp_store_t *st, const char *id, int64_t now_ms,
                               struct psp_answer *ans);

/* GET /v1/refunds: as psp_store_list, of one intent's refunds when
 * payment_intent is set (else of all); starting_after is a refund id. 404
 * resource_missing (param payment_intent) when the store has no such
 * intent, or no longer (deleted). */
struct psp_refund_list_query {
    int64_t created_gte, created_lt; /* INT64_MIN / INT64_MAX: unbounded */
    int limit;                       /* 1..100 */
    const char *starting_after;      /* NULL: from the newest */
    const char *payment_intent;      /* NULL: any */
};
void psp_store_refund_list(psp_store_t *st, const struct psp_refund_list_query *q,
                           int64_t now_ms, struct psp_answer *ans);

/* Moves a refund to status (succeeded or failed; failure_reason NULL:
 * expired_or_canceled_card): a pending one to either, a succeeded one to
 * failed (as Stripe's refunds that fail after succeeding). 200 with the
 * refund, 404 resource_missing, 409 when it cannot move so, 400 for another
 * status. */
void psp_store_refund_settle(psp_store_t *st, const char *id, const char *status,
                             const char *failure_reason, int64_t now_ms,
                             struct psp_answer *ans);

/* ---- states a broken integration or a person with dashboard access
 * makes, for the admin API. None queues a webhook. Bad input is 400
 * invalid_request_error, naming the member at fault in param (none for an
 * unknown member or a body that is no object). ---- */

/* POST /inject/intents: body {"count":1..200000 (1), "like":"pi_..." (copy
 * its amount, currency, customer, payment_method, metadata), "amount",
 * "currency" ("usd"), "metadata":{string values}, "status": succeeded |
 * processing | requires_payment_method | canceled, "id": a template
 * (default: fresh pi_ ids), "created": unix seconds (now), "start": the
 * first index (0)}; "{n}" in id and in metadata values becomes the index,
 * 12 zero-padded digits. Members given override like's; amount defaults
 * to 1000 and payment_method to pm_card_visa without like. Each intent is
 * whole (retrieve, list, search, refunds) and has a ledger row with
 * idempotency_key inject_<id> and injected true; the outcome counters count
 * it. 201 {"count":N,"ids":[the first 100 at most]}; 404 for an unknown
 * like; 409 resource_already_exists, nothing made, when an id is taken (by
 * a deleted intent too). */
void psp_store_inject_intents(psp_store_t *st, json_t *body, int64_t now_ms,
                              struct psp_answer *ans);

/* POST /intents/<id>/amend {"amount":N} and/or {"currency":"eur"}: changes
 * the intent and its ledger row, marked amended. 200 the intent, 404
 * resource_missing. */
void psp_store_amend(psp_store_t *st, const char *id, json_t *body, int64_t now_ms,
                     struct psp_answer *ans);

/* DELETE /intents/<id>: the provider no longer has the intent (retrieve,
 * search, list, cancel, settle and refunds of it: as for an unknown id) but
 * a list cursor naming it keeps its place; its ledger row stays, marked
 * deleted, and its refunds stay. 200 {"deleted":true,"id":...}, 404. */
void psp_store_delete(psp_store_t *st, const char *id, struct psp_answer *ans);

/* POST /inject/refunds {"payment_intent" (required), "amount" (the intent's
 * amount), "status": succeeded | pending | failed, "metadata", "created"}:
 * a refund made out of band, with no check of the intent's status or of
 * what is left to refund; in the refunds list and retrieve, and in the
 * ledger's refunds with injected true. 201 the refund, 404 unknown
 * intent. */
void psp_store_inject_refund(psp_store_t *st, json_t *body, int64_t now_ms,
                             struct psp_answer *ans);

/* Counters kept by the store (the HTTP layer adds its own). */
enum psp_counter {
    PSP_C_REQUESTS,
    PSP_C_EXECUTED,
    PSP_C_SUCCEEDED,
    PSP_C_DECLINED,
    PSP_C_PROCESSING,
    PSP_C_REPLAYED,
    PSP_C_IN_USE_409,
    PSP_C_IDEMPOTENCY_ERROR_400,
    PSP_C_INVALID_400,
    PSP_C_EXPIRED_KEYS,
    PSP_C_CANCELED,
    PSP_C_SETTLED, /* processing intents settled since (admin, by themselves or
                      canceled) */
    PSP_C_CANCELS, /* cancels executed */
    PSP_C_REFUNDS, /* refunds executed, then by their current status: */
    PSP_C_REFUNDS_SUCCEEDED,
    PSP_C_REFUNDS_PENDING,
    PSP_C_REFUNDS_FAILED,
    PSP_C_REFUNDS_SETTLED, /* pending or succeeded refunds moved since */
    /* Appended: the state file keeps counters by number. */
    PSP_C_REQUIRES_CAPTURE,       /* charges by outcome: authorized, not yet captured */
    PSP_C_CAPTURES,               /* captures executed */
    PSP_C_VOIDS,                  /* cancels executed of a requires_capture intent */
    PSP_C_AUTHORIZATIONS_EXPIRED, /* authorizations the provider canceled */
    PSP_C__COUNT
};
void psp_store_count(psp_store_t *st, enum psp_counter c);

/* A POST (a charge, or a cancel) was received, and its connection is done
 * with it: between the two it is in flight. The
 * ledger's counters show how many are (charges_in_flight) and the most
 * that ever were at once (max_charges_in_flight), so that a test can see
 * how many calls a client had out. */
void psp_store_charge_began(psp_store_t *st);
void psp_store_charge_ended(psp_store_t *st);

/* The ledger and counters as JSON (new reference): {"charges", "cancels",
 * "refunds", "refund_executions", "counters"}; counters intents and
 * refund_objects are the intents (deleted ones excluded) and refunds the
 * provider holds now. Every charge row has injected, amended and deleted,
 * every refund row injected. Each executed refund has one
 * row in refunds (idempotency_key, provider_refund_id, payment_intent_id,
 * amount, currency, reason, metadata, status as it is now, failure_reason,
 * http_status, at_ms, settled_at_ms); refund_executions maps each refund
 * key to how many refunds it executed (more than 1 only after its
 * retention ran out). A charge has one row whose outcome is its intent's current
 * one (a processing charge that settles, or an intent that is canceled,
 * changes outcome); succeeded, declined, canceled and processing count each
 * charge once, by that outcome. Each executed cancel has a row of its own
 * in cancels; requests, replayed, in_use_409, idempotency_error and
 * invalid_request count cancels too, executed only charges.
 *
 * Manual capture (docs/provider.md, "Manual capture"): every charge row has
 * kind, "charge" (capture_method automatic) or "authorization" (manual);
 * an authorization's row has amount_authorized, amount_capturable and
 * amount_received, and its outcome is requires_capture until it is
 * captured (then succeeded, amount the amount captured: where money moved)
 * or canceled (a void or its expiry). Every cancel row has kind ("cancel",
 * or "void" of a requires_capture intent) and payment_attempt_id; a void's
 * has amount_released. "captures" has a row per executed capture (kind
 * capture), "expiries" one per authorization the provider canceled (kind
 * expiry). requires_capture counts charges by outcome as the others do. */
json_t *psp_store_ledger_json(psp_store_t *st, int64_t now_ms);

/* Forgets keys, intents, ledger and counters (the most charges in flight at
 * once becomes the number in flight now). */
void psp_store_reset(psp_store_t *st);

/* ---- the state file (psp-sim --state-file) ----
 *
 * With a journal set, every call that changes the store (a begin, an
 * execute, a release, a setting, an admin change, a GET's count, and a
 * settlement a read found due) hands a record of itself to fn, under the
 * store's lock, so records come in the order of the changes: fn takes the
 * record (NULL when one could not be made: a string that is no UTF-8), must
 * not block for long nor call back into the store. Replaying the records,
 * in order, through psp_store_replay on a new store (no journal set yet)
 * makes the same state: ids, counters, keys with their answers and their
 * first-use times. NULL: none (as before a replay ends). */
typedef void (*psp_store_journal_fn)(void *ctx, json_t *record);
void psp_store_set_journal(psp_store_t *st, psp_store_journal_fn fn, void *ctx);

/* Applies one record (borrowed) as its call did. 0, or -1 when it is no
 * record this store makes. */
int psp_store_replay(psp_store_t *st, json_t *record);

/* Gives back every key whose request began but never executed nor was given
 * back: after a replay, those were in flight when psp-sim died, and their
 * clients got no answer. With a journal set, each is kept as a release, so
 * that a later replay frees it too. */
void psp_store_release_reserved(psp_store_t *st);

#endif
