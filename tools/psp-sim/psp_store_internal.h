/* psp_store_internal: what the store's modules share (psp_store.c,
 * psp_list.c, psp_capture.c, psp_refunds.c, psp_inject.c, psp_replay.c):
 * the store itself and the helpers each calls with the store's lock held.
 * Not for psp-sim's HTTP layer, which uses psp_store.h. */
#ifndef PSP_STORE_INTERNAL_H
#define PSP_STORE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "psp_store.h"

/* An object a list can show, in creation order (seq grows): the lists scan
 * these plain values instead of the JSON records. */
struct list_entry {
    int64_t created; /* unix seconds, as the object's created */
    int64_t seq;
    json_t *rec; /* borrowed from intents, deleted or refunds */
    int live;    /* 0 once the intent is deleted */
};

struct list_index {
    struct list_entry *v;
    size_t n, cap;
};

struct psp_store {
    pthread_mutex_t lock;
    int64_t retention_ms;
    int64_t search_lag_ms;        /* search sees an intent this long after creation */
    int64_t processing_settle_ms; /* > 0: processing succeeds this long after */
    json_t *keys;    /* idempotency key -> {fp, done, status, body, created_ms} */
    json_t *intents; /* pi id -> {pi: PaymentIntent, row: its ledger row, created_ms} */
    json_t *ledger;  /* array of executed charges */
    json_t *cancels; /* array of executed cancels */
    json_t *processing;        /* pi id -> its record in intents, while processing */
    json_t *refunds;           /* re id -> {refund, row, seq, created_ms, settle_to} */
    json_t *refund_rows;       /* array of executed refunds (the rows) */
    json_t *refunds_pending;   /* re id -> its record, while pending */
    json_t *refund_executions; /* refund key -> refunds it executed */
    json_t *deleted;           /* pi id -> record of a deleted intent: a list cursor
                                  naming it still has its place */
    struct list_index intent_index, refund_index;
    int64_t refund_settle_ms;        /* > 0: pending refunds settle this long after */
    int64_t authorization_expiry_ms; /* requires_capture is canceled this long
                                        after its authorization */
    json_t *authorized; /* pi id -> its record in intents, while requires_capture */
    json_t *captures;   /* array of executed captures */
    json_t *expiries;   /* array of authorizations the provider canceled */
    psp_store_observer_fn observer;
    void *observer_ctx;
    psp_store_event_fn event_observer;
    void *event_observer_ctx;
    psp_store_journal_fn journal; /* NULL: nothing is kept (or replaying) */
    void *journal_ctx;
    uint64_t next_id;
    long long counters[PSP_C__COUNT];
    long long charges_in_flight, max_charges_in_flight;
};
/* Test payment methods, as the contract names them, plus one that stays
 * processing until settled (psp_store_settle, or by itself after
 * processing_settle_ms). */
struct psp_method {
    const char *name;
    const char *status; /* succeeded, processing, or NULL when declined */
    const char *decline_code;
    const char *message;
    const char *refund; /* how its refunds go: NULL succeeded, "pending" (then
                           succeeded), "pending_fail" (then failed), "failed" */
};

/* What a list page may show: objects created in [created_gte, created_lt),
 * after the cursor in the list's order (after_seq < 0: no cursor), that
 * keep() accepts (NULL: all). */
struct list_scan {
    int64_t created_gte, created_lt;
    int64_t after_created, after_seq;
    int (*keep)(json_t *rec, const char *want);
    const char *want;
};

/* Pages hold 1..100 objects: one more tells whether another page follows. */
#define LIST_MAX 100

void pst_journal(psp_store_t *st, const char *op, int64_t now_ms, json_t *record);
void pst_observe(psp_store_t *st, json_t *pi, int64_t at_ms);
void pst_fingerprint(const char *body, char out[17]);
void pst_answer_json(struct psp_answer *ans, int status, json_t *body);
void pst_answer_error(struct psp_answer *ans, int status, const char *type,
                      const char *code, const char *param, const char *message);
const struct psp_method *pst_find_method(const char *name);
void pst_printable(const char *value, char out[72]);
void pst_no_such(const char *what, const char *value, char *out, size_t outlen);
int pst_currency_valid(const char *c);
int pst_answer_from_key(psp_store_t *st, const char *key, const char *path,
                        const char *fp, int64_t now_ms, struct psp_answer *ans);
void pst_reserve_key(psp_store_t *st, const char *key, const char *path, const char *fp,
                     int64_t now_ms);
void pst_store_answer(psp_store_t *st, const char *key, const struct psp_answer *ans);
void pst_fresh_id(psp_store_t *st, const char *prefix, json_t *taken, json_t *taken2,
                  int64_t now_ms, char *out, size_t outlen);
json_t *pst_add_intent(psp_store_t *st, const char *id, json_t *pi, json_t *row,
                       int64_t created_ms);
void pst_settle_if_due(psp_store_t *st, json_t *rec, int64_t now_ms);
void pst_answer_no_such_intent(struct psp_answer *ans, const char *id);
int pst_index_reserve(struct list_index *ix, size_t more);
void pst_index_append(struct list_index *ix, int64_t created, int64_t seq, json_t *rec);
struct list_entry *pst_index_find(struct list_index *ix, int64_t seq);
size_t pst_select_page(const struct list_index *ix, const struct list_scan *s,
                       const struct list_entry **page, size_t k);
json_int_t pst_rec_seq(json_t *rec);
void pst_charge_id_of(const char *pi_id, char *out, size_t outlen);
void pst_count_refund_status(psp_store_t *st, const char *status, int delta);
void pst_settle_refund_if_due(psp_store_t *st, json_t *rec, int64_t now_ms);
void pst_add_refund(psp_store_t *st, json_t *irec, json_t *refund, json_t *row,
                    int64_t created_ms, const char *settle_to);
json_t *pst_charge_record(const struct psp_charge_request *req);
json_t *pst_cancel_record(const struct psp_cancel_request *req);
json_t *pst_refund_record(const struct psp_refund_request *req);
json_t *pst_body_record(json_t *body);
json_t *pst_id_and_body_record(const char *id, json_t *body);

/* ---- manual capture (psp_capture.c) ---- */

/* Caller holds the lock. A requires_capture intent whose authorization is
 * older than the expiry is canceled (cancellation_reason automatic) as of
 * when it was due. */
void pst_expire_if_due(psp_store_t *st, json_t *rec, int64_t now_ms);
/* Caller holds the lock. Ms until rec's authorization expires (<= 0: due),
 * or -1 when it is no requires_capture intent. */
int64_t pst_expiry_left(psp_store_t *st, json_t *rec, int64_t now_ms);
/* Caller holds the lock. Marks rec (an intent just made or settled
 * requires_capture at at_ms) authorized: expiry counts from at_ms. */
void pst_authorize(psp_store_t *st, json_t *rec, int64_t at_ms);
/* Caller holds the lock. Gives back a reserved key a refused execute
 * reserved (NULL: none). */
void pst_release_reserved_key(psp_store_t *st, const char *key);
/* Sets the intent's amount_capturable and amount_received for its status
 * now (requires_capture: all capturable; succeeded: all received) and, when
 * row is not NULL, its charge row's kind and, for an authorization, its
 * amounts. A capture sets what it captured itself. */
void pst_money_fields(json_t *pi, json_t *row);
json_t *pst_capture_record(const struct psp_capture_request *req);

#endif
