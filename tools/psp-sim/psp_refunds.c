/* psp_refunds: refunds (POST /v1/refunds and their settlement), with
 * Stripe's semantics. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psp_store_internal.h"

/* ---- refunds ---- */

static const char refund_path[] = "/v1/refunds";

void psp_store_set_refund_settle(psp_store_t *st, int64_t settle_ms)
{
    pthread_mutex_lock(&st->lock);
    st->refund_settle_ms = settle_ms;
    if (st->journal)
        pst_journal(st, "set", 0,
                    json_pack("{s:s, s:I}", "name", "refund_settle_ms", "ms",
                              (json_int_t)settle_ms));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_set_event_observer(psp_store_t *st, psp_store_event_fn fn, void *ctx)
{
    pthread_mutex_lock(&st->lock);
    st->event_observer = fn;
    st->event_observer_ctx = ctx;
    pthread_mutex_unlock(&st->lock);
}

/* Caller holds the lock. */
static void observe_event(psp_store_t *st, const char *type, json_t *object,
                          int64_t at_ms)
{
    if (st->event_observer)
        st->event_observer(st->event_observer_ctx, type, object, at_ms);
}

static const char *refund_status(json_t *rec)
{
    const char *s =
        json_string_value(json_object_get(json_object_get(rec, "refund"), "status"));
    return s ? s : "";
}

/* The intent's charge id: Stripe's ch_ beside its pi_. */
void pst_charge_id_of(const char *pi_id, char *out, size_t outlen)
{
    snprintf(out, outlen, "ch_%s", strncmp(pi_id, "pi_", 3) ? pi_id : pi_id + 3);
}

/* Caller holds the lock. The sum of an intent's refunds in `status`, or of
 * all but the failed ones when status is NULL. */
static long long refunded_sum(psp_store_t *st, json_t *intent_rec, const char *status)
{
    long long sum = 0;
    size_t i;
    json_t *id;
    json_array_foreach(json_object_get(intent_rec, "refunds"), i, id)
    {
        json_t *rec = json_object_get(st->refunds, json_string_value(id));
        const char *s = refund_status(rec);
        if (status ? !strcmp(s, status) : strcmp(s, "failed") != 0)
            sum += json_integer_value(
                json_object_get(json_object_get(rec, "refund"), "amount"));
    }
    return sum;
}

/* What the intent's charge took: all of its amount, or for a manual one
 * what was captured (Stripe bounds refunds by amount_received). */
static long long captured_of(json_t *pi)
{
    const char *how = json_string_value(json_object_get(pi, "capture_method"));
    return json_integer_value(json_object_get(
        pi, how && !strcmp(how, "manual") ? "amount_received" : "amount"));
}

/* Caller holds the lock. The charge.refunded object of an intent: a
 * Stripe charge with amount_refunded and its refunds, newest first. */
static json_t *charge_object(psp_store_t *st, json_t *intent_rec)
{
    json_t *pi = json_object_get(intent_rec, "pi"), *data = json_array(), *id;
    const char *pi_id = json_string_value(json_object_get(pi, "id"));
    json_int_t amount = json_integer_value(json_object_get(pi, "amount"));
    long long captured = captured_of(pi);
    long long refunded = refunded_sum(st, intent_rec, "succeeded");
    json_t *ids = json_object_get(intent_rec, "refunds");
    char ch[300], url[340];

    for (size_t i = json_array_size(ids); i-- > 0;) {
        id = json_array_get(ids, i);
        json_array_append(
            data, json_object_get(json_object_get(st->refunds, json_string_value(id)),
                                  "refund"));
    }
    pst_charge_id_of(pi_id, ch, sizeof(ch));
    snprintf(url, sizeof(url), "/v1/charges/%s/refunds", ch);
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:O, s:s, s:b, s:s, s:O, s:I, s:{s:s, "
                     "s:o, s:b, s:s}}",
                     "id", ch, "object", "charge", "amount", amount, "amount_captured",
                     (json_int_t)captured, "amount_refunded", (json_int_t)refunded,
                     "currency", json_object_get(pi, "currency"), "payment_intent",
                     pi_id, "refunded", refunded >= captured, "status", "succeeded",
                     "metadata", json_object_get(pi, "metadata"), "created",
                     json_integer_value(json_object_get(pi, "created")), "refunds",
                     "object", "list", "data", data, "has_more", 0, "url", url);
}

/* Caller holds the lock. Counts a refund once more by its current status. */
void pst_count_refund_status(psp_store_t *st, const char *status, int delta)
{
    enum psp_counter c = !strcmp(status, "succeeded") ? PSP_C_REFUNDS_SUCCEEDED
                         : !strcmp(status, "pending") ? PSP_C_REFUNDS_PENDING
                                                      : PSP_C_REFUNDS_FAILED;
    st->counters[c] += delta;
}

/* Caller holds the lock. Moves a refund to status at at_ms: the refund, its
 * ledger row, the counters and the events (refund.updated; refund.failed;
 * charge.refunded when it succeeded). */
static void apply_refund_settlement(psp_store_t *st, json_t *rec, const char *status,
                                    const char *failure_reason, int64_t at_ms)
{
    json_t *refund = json_object_get(rec, "refund"), *row = json_object_get(rec, "row");
    const char *id = json_string_value(json_object_get(refund, "id"));

    pst_count_refund_status(st, refund_status(rec), -1);
    pst_count_refund_status(st, status, 1);
    st->counters[PSP_C_REFUNDS_SETTLED]++;
    json_object_set_new(refund, "status", json_string(status));
    json_object_set_new(row, "status", json_string(status));
    if (!strcmp(status, "failed")) {
        const char *why = failure_reason ? failure_reason : "expired_or_canceled_card";
        json_object_set_new(refund, "failure_reason", json_string(why));
        json_object_set_new(row, "failure_reason", json_string(why));
    }
    json_object_set_new(row, "settled_at_ms", json_integer(at_ms));
    json_object_del(st->refunds_pending, id);
    observe_event(st, "refund.updated", refund, at_ms);
    if (!strcmp(status, "failed"))
        observe_event(st, "refund.failed", refund, at_ms);
    json_t *irec = json_object_get(
        st->intents, json_string_value(json_object_get(refund, "payment_intent")));
    /* A deleted intent has no charge left to tell about. */
    if (!strcmp(status, "succeeded") && irec) {
        json_t *charge = charge_object(st, irec);
        observe_event(st, "charge.refunded", charge, at_ms);
        json_decref(charge);
    }
}

/* Caller holds the lock. With refund_settle_ms a pending refund reaches its
 * end that long after its creation, settled when first looked at. */
void pst_settle_refund_if_due(psp_store_t *st, json_t *rec, int64_t now_ms)
{
    int64_t created = json_integer_value(json_object_get(rec, "created_ms"));
    if (st->refund_settle_ms > 0 && !strcmp(refund_status(rec), "pending") &&
        now_ms - created >= st->refund_settle_ms) {
        const char *to = json_string_value(json_object_get(rec, "settle_to"));
        apply_refund_settlement(st, rec, to ? to : "succeeded", NULL,
                                created + st->refund_settle_ms);
        if (st->journal)
            pst_journal(
                st, "refund_settle_due", now_ms,
                json_pack("{s:O}", "id",
                          json_object_get(json_object_get(rec, "refund"), "id")));
    }
}

/* Returns 0 when the parameters are Stripe's, else fills a 400; *amount
 * gets the amount asked for (0: the rest). */
static int validate_refund(const struct psp_refund_request *req, long long *amount,
                           struct psp_answer *ans)
{
    static const char *const reasons[] = {"duplicate", "fraudulent",
                                          "requested_by_customer"};
    char *end;

    if (req->unknown_parameter) {
        char shown[65], msg[128];
        size_t i;
        for (i = 0; req->unknown_parameter[i] && i < 64; i++) {
            unsigned char c = (unsigned char)req->unknown_parameter[i];
            shown[i] = c > 0x20 && c < 0x7f ? (char)c : '?';
        }
        shown[i] = '\0';
        snprintf(msg, sizeof(msg), "Received unknown parameter: %s", shown);
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_unknown", shown,
                         msg);
        return -1;
    }
    if (!req->payment_intent || !*req->payment_intent) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                         "payment_intent", "Missing required param: payment_intent.");
        return -1;
    }
    *amount = 0;
    if (req->amount) {
        errno = 0;
        *amount = strtoll(req->amount, &end, 10);
        if (errno || *end || end == req->amount || *amount < 1 ||
            *amount > 99999999999999LL) {
            pst_answer_error(ans, 400, "invalid_request_error",
                             "parameter_invalid_integer", "amount",
                             "Invalid positive integer: amount.");
            return -1;
        }
    }
    if (!req->reason)
        return 0;
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (!strcmp(req->reason, reasons[i]))
            return 0;
    pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid", "reason",
                     "Invalid reason: must be one of duplicate, fraudulent or "
                     "requested_by_customer.");
    return -1;
}

/* Caller holds the lock. The intent a refund of `amount` (0: the rest) may
 * execute on, *amount set to what it refunds; else NULL and *ans is the
 * refusal Stripe gives. */
static json_t *refundable_intent(psp_store_t *st, const char *pi_id, long long *amount,
                                 int64_t now_ms, struct psp_answer *ans)
{
    json_t *rec = json_object_get(st->intents, pi_id);
    char msg[200];

    if (!rec) {
        pst_no_such("payment_intent", pi_id, msg, sizeof(msg));
        pst_answer_error(ans, 404, "invalid_request_error", "resource_missing",
                         "payment_intent", msg);
        return NULL;
    }
    pst_settle_if_due(st, rec, now_ms);
    json_t *pi = json_object_get(rec, "pi");
    const char *status = json_string_value(json_object_get(pi, "status"));
    long long total = captured_of(pi);
    long long left = total - refunded_sum(st, rec, NULL);
    if (!status || strcmp(status, "succeeded") != 0) {
        snprintf(msg, sizeof(msg),
                 "This PaymentIntent does not have a successful charge to refund "
                 "(its status is %s).",
                 status ? status : "unknown");
        pst_answer_error(ans, 400, "invalid_request_error", "charge_not_refundable",
                         "payment_intent", msg);
    } else if (left <= 0) {
        pst_answer_error(ans, 400, "invalid_request_error", "charge_already_refunded",
                         NULL, "This charge has already been refunded.");
    } else if (*amount > left) {
        snprintf(msg, sizeof(msg),
                 "Refund amount (%lld) is greater than unrefunded amount on charge "
                 "(%lld).",
                 *amount, left);
        pst_answer_error(ans, 400, "invalid_request_error", "amount_too_large",
                         "amount", msg);
    } else {
        if (*amount == 0)
            *amount = left;
        return rec;
    }
    st->counters[PSP_C_INVALID_400]++;
    return NULL;
}

enum psp_begin psp_store_refund_begin(psp_store_t *st,
                                      const struct psp_refund_request *req,
                                      int64_t now_ms, struct psp_answer *ans)
{
    char fp[17];
    long long amount;
    enum psp_begin rc = PSP_BEGIN_ANSWERED;

    pst_fingerprint(req->body, fp);
    pthread_mutex_lock(&st->lock);
    st->counters[PSP_C_REQUESTS]++;
    if (pst_answer_from_key(st, req->idempotency_key, refund_path, fp, now_ms, ans))
        goto out;
    if (validate_refund(req, &amount, ans) != 0) {
        st->counters[PSP_C_INVALID_400]++;
        goto out;
    }
    if (!refundable_intent(st, req->payment_intent, &amount, now_ms, ans))
        goto out;
    pst_reserve_key(st, req->idempotency_key, refund_path, fp, now_ms);
    rc = PSP_BEGIN_EXECUTE;
out:
    if (st->journal)
        pst_journal(st, "refund_begin", now_ms, pst_refund_record(req));
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* Caller holds the lock and reserved a place in refund_index. Keeps the
 * refund (taken) of the intent irec with its ledger row (taken), as
 * psp_store_refund_execute and an injection make them. */
void pst_add_refund(psp_store_t *st, json_t *irec, json_t *refund, json_t *row,
                    int64_t created_ms, const char *settle_to)
{
    const char *id = json_string_value(json_object_get(refund, "id"));
    int64_t seq = (int64_t)st->next_id++;

    json_array_append(st->refund_rows, row);
    json_t *rec = json_pack("{s:o, s:o, s:I, s:I, s:s}", "refund", refund, "row", row,
                            "created_ms", (json_int_t)created_ms, "seq",
                            (json_int_t)seq, "settle_to", settle_to);
    json_object_set_new(st->refunds, id, rec);
    pst_index_append(&st->refund_index,
                     json_integer_value(json_object_get(refund, "created")), seq, rec);
    if (!json_is_array(json_object_get(irec, "refunds")))
        json_object_set_new(irec, "refunds", json_array());
    json_array_append_new(json_object_get(irec, "refunds"), json_string(id));
    if (!strcmp(refund_status(rec), "pending"))
        json_object_set(st->refunds_pending, id, rec);
}

int psp_store_refund_execute(psp_store_t *st, const struct psp_refund_request *req,
                             int64_t now_ms, struct psp_answer *ans)
{
    long long amount = 0;
    int executed = 0;
    char id[40], ch[300];

    pthread_mutex_lock(&st->lock);
    /* Another refund of the intent may have taken what was left meanwhile
     * (latency): checked again, as begin did. */
    int refused = validate_refund(req, &amount, ans) != 0 ||
                  !refundable_intent(st, req->payment_intent, &amount, now_ms, ans);
    if (!refused && pst_index_reserve(&st->refund_index, 1) != 0) {
        pst_answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        refused = 1;
    }
    if (refused) {
        json_t *e = req->idempotency_key
                        ? json_object_get(st->keys, req->idempotency_key)
                        : NULL;
        if (e && !json_integer_value(json_object_get(e, "done")))
            json_object_del(st->keys, req->idempotency_key);
        goto out;
    }
    json_t *irec = json_object_get(st->intents, req->payment_intent);
    json_t *pi = json_object_get(irec, "pi");
    const struct psp_method *m =
        pst_find_method(json_string_value(json_object_get(pi, "payment_method")));
    const char *how = m ? m->refund : NULL;
    const char *status = !how                     ? "succeeded"
                         : !strcmp(how, "failed") ? "failed"
                                                  : "pending";
    pst_fresh_id(st, "re", st->refunds, NULL, now_ms, id, sizeof(id));
    pst_charge_id_of(req->payment_intent, ch, sizeof(ch));
    json_t *metadata =
        json_is_object(req->metadata) ? json_deep_copy(req->metadata) : json_object();
    json_t *refund =
        json_pack("{s:s, s:s, s:I, s:s, s:O, s:s, s:s, s:s?, s:o, s:I}", "id", id,
                  "object", "refund", "amount", (json_int_t)amount, "charge", ch,
                  "currency", json_object_get(pi, "currency"), "payment_intent",
                  req->payment_intent, "status", status, "reason", req->reason,
                  "metadata", metadata, "created", (json_int_t)(now_ms / 1000));
    if (!strcmp(status, "failed"))
        json_object_set_new(refund, "failure_reason",
                            json_string("lost_or_stolen_card"));
    json_t *row = json_pack(
        "{s:s?, s:s, s:s, s:I, s:O, s:s?, s:O, s:s, s:O?, s:i, s:I, s:n, s:b}",
        "idempotency_key", req->idempotency_key, "provider_refund_id", id,
        "payment_intent_id", req->payment_intent, "amount", (json_int_t)amount,
        "currency", json_object_get(pi, "currency"), "reason", req->reason, "metadata",
        json_object_get(refund, "metadata"), "status", status, "failure_reason",
        json_object_get(refund, "failure_reason"), "http_status", 200, "at_ms",
        (json_int_t)now_ms, "settled_at_ms", "injected", 0);
    pst_add_refund(st, irec, refund, row, now_ms,
                   how && !strcmp(how, "pending_fail") ? "failed" : "succeeded");
    if (req->idempotency_key) {
        json_t *n = json_object_get(st->refund_executions, req->idempotency_key);
        json_object_set_new(st->refund_executions, req->idempotency_key,
                            json_integer(json_integer_value(n) + 1));
    }
    st->counters[PSP_C_REFUNDS]++;
    pst_count_refund_status(st, status, 1);
    observe_event(st, "refund.created", refund, now_ms);
    if (!strcmp(status, "failed"))
        observe_event(st, "refund.failed", refund, now_ms);
    if (!strcmp(status, "succeeded")) {
        json_t *charge = charge_object(st, irec);
        observe_event(st, "charge.refunded", charge, now_ms);
        json_decref(charge);
    }
    pst_answer_json(ans, 200, json_incref(refund));
    pst_store_answer(st, req->idempotency_key, ans);
    executed = 1;
out:
    if (st->journal)
        pst_journal(st, "refund_execute", now_ms, pst_refund_record(req));
    pthread_mutex_unlock(&st->lock);
    return executed;
}

static void answer_no_such_refund(struct psp_answer *ans, const char *id)
{
    char msg[128];
    pst_no_such("refund", id, msg, sizeof(msg));
    pst_answer_error(ans, 404, "invalid_request_error", "resource_missing", "id", msg);
}

void psp_store_refund_retrieve(psp_store_t *st, const char *id, int64_t now_ms,
                               struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->refunds, id);
    if (rec) {
        pst_settle_refund_if_due(st, rec, now_ms);
        pst_answer_json(ans, 200, json_deep_copy(json_object_get(rec, "refund")));
    } else {
        answer_no_such_refund(ans, id);
    }
    pthread_mutex_unlock(&st->lock);
}

static int refund_of_intent(json_t *rec, const char *payment_intent)
{
    const char *pi = json_string_value(
        json_object_get(json_object_get(rec, "refund"), "payment_intent"));
    return pi && !strcmp(pi, payment_intent);
}

void psp_store_refund_list(psp_store_t *st, const struct psp_refund_list_query *q,
                           int64_t now_ms, struct psp_answer *ans)
{
    const struct list_entry *page[LIST_MAX + 1];
    int limit = q->limit < 1 ? 1 : q->limit > LIST_MAX ? LIST_MAX : q->limit;
    struct list_scan scan = {q->created_gte,
                             q->created_lt,
                             0,
                             -1,
                             q->payment_intent ? refund_of_intent : NULL,
                             q->payment_intent};
    json_t *data = json_array();

    pthread_mutex_lock(&st->lock);
    if (q->payment_intent && !json_object_get(st->intents, q->payment_intent)) {
        /* As Stripe: the intent filtered on must exist (a deleted one does
         * not), or there is no list at all. */
        char msg[128];
        pst_no_such("payment_intent", q->payment_intent, msg, sizeof(msg));
        pst_answer_error(ans, 404, "invalid_request_error", "resource_missing",
                         "payment_intent", msg);
        goto out;
    }
    if (q->starting_after) {
        json_t *cursor = json_object_get(st->refunds, q->starting_after);
        if (!cursor) {
            char msg[128];
            pst_no_such("refund", q->starting_after, msg, sizeof(msg));
            pst_answer_error(ans, 400, "invalid_request_error", "resource_missing",
                             "starting_after", msg);
            goto out;
        }
        scan.after_created = json_integer_value(
            json_object_get(json_object_get(cursor, "refund"), "created"));
        scan.after_seq = pst_rec_seq(cursor);
    }
    size_t n = pst_select_page(&st->refund_index, &scan, page, (size_t)limit + 1);
    for (size_t i = 0; i < n && i < (size_t)limit; i++) {
        pst_settle_refund_if_due(st, page[i]->rec, now_ms);
        json_array_append_new(data,
                              json_deep_copy(json_object_get(page[i]->rec, "refund")));
    }
    pst_answer_json(ans, 200,
                    json_pack("{s:s, s:s, s:b, s:O}", "object", "list", "url",
                              refund_path, "has_more", n > (size_t)limit, "data",
                              data));
out:
    pthread_mutex_unlock(&st->lock);
    json_decref(data);
}

void psp_store_refund_settle(psp_store_t *st, const char *id, const char *status,
                             const char *failure_reason, int64_t now_ms,
                             struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->refunds, id);
    if (!status ||
        (strcmp(status, "succeeded") != 0 && strcmp(status, "failed") != 0)) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid",
                         "status", "status must be succeeded or failed");
    } else if (!rec) {
        answer_no_such_refund(ans, id);
    } else {
        pst_settle_refund_if_due(st, rec, now_ms);
        const char *now = refund_status(rec);
        if (!strcmp(now, "pending") ||
            (!strcmp(now, "succeeded") && !strcmp(status, "failed"))) {
            apply_refund_settlement(st, rec, status, failure_reason, now_ms);
            pst_answer_json(ans, 200, json_deep_copy(json_object_get(rec, "refund")));
        } else {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "This refund's status is %s; it cannot become %s.", now, status);
            pst_answer_error(ans, 409, "invalid_request_error",
                             "refund_unexpected_state", NULL, msg);
        }
    }
    if (st->journal)
        pst_journal(st, "refund_settle", now_ms,
                    json_pack("{s:s, s:s?, s:s?}", "id", id, "status", status,
                              "failure_reason", failure_reason));
    pthread_mutex_unlock(&st->lock);
}
