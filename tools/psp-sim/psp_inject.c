/* psp_inject: the admin API's states made behind the API's back. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psp_store_internal.h"

/* ---- states made behind the API's back: a broken integration, or a
 * person with dashboard access ---- */

#define INDEX_DIGITS 12
#define INDEX_MAX    999999999999LL
#define AMOUNT_MAX   99999999999999LL

/* tmpl with each "{n}" replaced by n as 12 zero-padded digits, into out
 * (cut to outlen; outlen 0: nothing written). Returns the whole length, as
 * snprintf does. */
static size_t expand(const char *tmpl, long long n, char *out, size_t outlen)
{
    char digits[INDEX_DIGITS + 8];
    size_t len = 0;

    snprintf(digits, sizeof(digits), "%0*lld", INDEX_DIGITS, n);
    for (const char *p = tmpl; *p;) {
        const char *piece = p;
        size_t pl = 1;
        if (!strncmp(p, "{n}", 3)) {
            piece = digits;
            pl = INDEX_DIGITS;
            p += 3;
        } else {
            p++;
        }
        for (size_t i = 0; i < pl; i++, len++)
            if (len + 1 < outlen)
                out[len] = piece[i];
    }
    if (outlen)
        out[len < outlen ? len : outlen - 1] = '\0';
    return len;
}

/* A 400 of the admin API about one member of the body. */
static void answer_bad(struct psp_answer *ans, const char *param, const char *message)
{
    pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid", param,
                     message);
}

/* 0 when every member of body is one of names (NULL-terminated) and body is
 * an object; else fills a 400. */
static int members_known(json_t *body, const char *const *names, struct psp_answer *ans)
{
    const char *k;
    json_t *v;
    char msg[128];

    if (!json_is_object(body)) {
        answer_bad(ans, NULL, "body must be a JSON object");
        return -1;
    }
    json_object_foreach(body, k, v)
    {
        size_t i;
        for (i = 0; names[i] && strcmp(names[i], k) != 0; i++)
            ;
        if (!names[i]) {
            char shown[72];
            pst_printable(k, shown);
            snprintf(msg, sizeof(msg), "unknown member '%s'", shown);
            answer_bad(ans, NULL, msg);
            return -1;
        }
    }
    return 0;
}

/* body's member name, when present: an integer in min..max into *out (0),
 * absent (0, *out untouched), else a 400 saying so (-1). */
static int member_int(json_t *body, const char *name, long long min, long long max,
                      long long *out, struct psp_answer *ans)
{
    json_t *v = json_object_get(body, name);
    char msg[160];

    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < min ||
        json_integer_value(v) > max) {
        snprintf(msg, sizeof(msg), "%s must be an integer in %lld..%lld", name, min,
                 max);
        answer_bad(ans, name, msg);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

/* Stripe's metadata limits (50 keys of at most 40 characters, no square
 * brackets; string values of at most 500 characters, counted once "{n}" is
 * expanded when `templated`). 0, or -1 with a 400. */
static int metadata_valid(json_t *md, int templated, struct psp_answer *ans)
{
    const char *k;
    json_t *v;
    char msg[160];

    if (!json_is_object(md) || json_object_size(md) > 50) {
        answer_bad(ans, "metadata", "metadata must be an object of at most 50 keys");
        return -1;
    }
    json_object_foreach(md, k, v)
    {
        size_t kl = strlen(k);
        const char *s = json_string_value(v);
        char shown[72];
        pst_printable(k, shown);
        if (kl < 1 || kl > 40 || strpbrk(k, "[]")) {
            snprintf(msg, sizeof(msg),
                     "metadata key '%s' must be 1..40 characters without [ or ]",
                     shown);
            answer_bad(ans, "metadata", msg);
            return -1;
        }
        if (!s || (templated ? expand(s, 0, NULL, 0) : strlen(s)) > 500) {
            snprintf(msg, sizeof(msg),
                     "metadata['%s'] must be a string of at most 500 characters",
                     shown);
            answer_bad(ans, "metadata", msg);
            return -1;
        }
    }
    return 0;
}

/* An injected object's id: 1..255 letters, digits, '_' or '-' (it goes into
 * URLs and the ledger as it is). */
static int object_id_valid(const char *id, size_t len)
{
    return len >= 1 && len <= 255 &&
           strspn(id, "abcdefghijklmnopqrstuvwxyz"
                      "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == len;
}

/* The intents POST /inject/intents asks for, checked. Strings and metadata
 * point into the body or into the intent it is like. */
struct intent_injection {
    long long count, start, amount, created;
    const char *currency, *customer, *payment_method, *status, *id_template;
    json_t *metadata;
};

/* Caller holds the lock (`like` reads an intent). 0, or -1 with *ans the
 * refusal: 400 for bad input, 404 for an unknown `like`. */
static int injection_parse(psp_store_t *st, json_t *body, int64_t now_ms,
                           struct intent_injection *in, struct psp_answer *ans)
{
    static const char *const names[] = {"count",    "like",   "amount", "currency",
                                        "metadata", "status", "id",     "created",
                                        "start",    NULL};
    static const char *const statuses[] = {"succeeded", "processing",
                                           "requires_payment_method", "canceled"};
    json_t *v;
    char msg[320];

    *in = (struct intent_injection){.count = 1,
                                    .amount = 1000,
                                    .created = now_ms / 1000,
                                    .currency = "usd",
                                    .payment_method = "pm_card_visa",
                                    .status = "succeeded"};
    if (members_known(body, names, ans) != 0)
        return -1;
    if ((v = json_object_get(body, "like")) != NULL) {
        if (!json_is_string(v)) {
            answer_bad(ans, "like", "like must be a payment intent id");
            return -1;
        }
        json_t *rec = json_object_get(st->intents, json_string_value(v));
        if (!rec) {
            pst_no_such("payment_intent", json_string_value(v), msg, sizeof(msg));
            pst_answer_error(ans, 404, "invalid_request_error", "resource_missing",
                             "like", msg);
            return -1;
        }
        json_t *pi = json_object_get(rec, "pi");
        in->amount = json_integer_value(json_object_get(pi, "amount"));
        in->currency = json_string_value(json_object_get(pi, "currency"));
        in->customer = json_string_value(json_object_get(pi, "customer"));
        in->payment_method = json_string_value(json_object_get(pi, "payment_method"));
        in->metadata = json_object_get(pi, "metadata");
    }
    if (member_int(body, "count", 1, 200000, &in->count, ans) != 0 ||
        member_int(body, "start", 0, INDEX_MAX, &in->start, ans) != 0 ||
        member_int(body, "amount", 1, AMOUNT_MAX, &in->amount, ans) != 0 ||
        member_int(body, "created", 0, 253402300799LL, &in->created, ans) != 0)
        return -1;
    if (in->start + in->count - 1 > INDEX_MAX) {
        answer_bad(ans, "start", "start + count - 1 must fit in 12 digits");
        return -1;
    }
    if ((v = json_object_get(body, "currency")) != NULL &&
        !pst_currency_valid(in->currency = json_string_value(v))) {
        answer_bad(ans, "currency", "currency must be three lower-case letters");
        return -1;
    }
    if ((v = json_object_get(body, "metadata")) != NULL) {
        if (metadata_valid(v, 1, ans) != 0)
            return -1;
        in->metadata = v;
    }
    if ((v = json_object_get(body, "status")) != NULL) {
        size_t i;
        in->status = json_string_value(v);
        for (i = 0; i < 4 && (!in->status || strcmp(in->status, statuses[i])); i++)
            ;
        if (i == 4) {
            answer_bad(ans, "status",
                       "status must be succeeded, processing, "
                       "requires_payment_method or canceled");
            return -1;
        }
    }
    if ((v = json_object_get(body, "id")) != NULL) {
        char id[300];
        in->id_template = json_string_value(v);
        size_t len =
            in->id_template ? expand(in->id_template, in->start, id, sizeof(id)) : 0;
        if (!object_id_valid(id, len) || !in->id_template) {
            answer_bad(ans, "id", "id must expand to 1..255 letters, digits, _ or -");
            return -1;
        }
        if (in->count > 1 && !strstr(in->id_template, "{n}")) {
            answer_bad(ans, "id", "id must hold {n} when count is more than 1");
            return -1;
        }
    }
    return 0;
}

/* The metadata of injected intent n (a new reference). */
static json_t *metadata_for(json_t *tmpl, long long n)
{
    json_t *md = json_object(), *v;
    const char *k;

    json_object_foreach(tmpl, k, v)
    {
        const char *s = json_string_value(v);
        size_t len = expand(s, n, NULL, 0);
        char *value = malloc(len + 1);
        if (value) {
            expand(s, n, value, len + 1);
            json_object_set_new(md, k, json_string(value));
        }
        free(value);
    }
    return md;
}

/* Caller holds the lock. Makes injected intent `id` with index n. */
static void inject_intent(psp_store_t *st, const struct intent_injection *in,
                          const char *id, long long n, int64_t now_ms)
{
    json_t *md = metadata_for(in->metadata, n);
    json_t *pi = json_pack(
        "{s:s, s:s, s:I, s:s, s:s, s:s?, s:n, s:I, s:o, s:s, s:n}", "id", id, "object",
        "payment_intent", "amount", (json_int_t)in->amount, "currency", in->currency,
        "payment_method", in->payment_method, "customer", in->customer,
        "automatic_payment_methods", "created", (json_int_t)in->created, "metadata", md,
        "status", in->status, "last_payment_error");
    const char *outcome = in->status;
    enum psp_counter c = PSP_C_SUCCEEDED;
    int http = 200;
    char key[320];

    if (!strcmp(in->status, "processing")) {
        c = PSP_C_PROCESSING;
    } else if (!strcmp(in->status, "requires_payment_method")) {
        json_object_set_new(pi, "last_payment_error",
                            json_pack("{s:s, s:s, s:s, s:s}", "type", "card_error",
                                      "code", "card_declined", "decline_code",
                                      "generic_decline", "message",
                                      "Your card was declined."));
        outcome = "declined";
        c = PSP_C_DECLINED;
        http = 402;
    } else if (!strcmp(in->status, "canceled")) {
        json_object_set_new(pi, "canceled_at", json_integer(in->created));
        json_object_set_new(pi, "cancellation_reason", json_null());
        c = PSP_C_CANCELED;
    }
    snprintf(key, sizeof(key), "inject_%s", id);
    json_t *row = json_pack(
        "{s:s, s:s, s:O?, s:O?, s:s?, s:I, s:s, s:s, s:i, s:I, s:n, s:b, s:b, s:b}",
        "idempotency_key", key, "payment_intent_id", id, "payment_attempt_id",
        json_object_get(md, "payment_attempt_id"), "order_id",
        json_object_get(md, "order_id"), "customer", in->customer, "amount",
        (json_int_t)in->amount, "currency", in->currency, "outcome", outcome,
        "http_status", http, "at_ms", (json_int_t)now_ms, "settled_at_ms", "injected",
        1, "amended", 0, "deleted", 0);
    json_object_set_new(pi, "capture_method", json_string("automatic"));
    pst_money_fields(pi, row);
    /* Its creation (created) is when search finds it and when it settles
     * by itself. */
    pst_add_intent(st, id, pi, row,
                   in->created == now_ms / 1000 ? now_ms : (int64_t)in->created * 1000);
    json_decref(pi);
    st->counters[c]++;
}

void psp_store_inject_intents(psp_store_t *st, json_t *body, int64_t now_ms,
                              struct psp_answer *ans)
{
    struct intent_injection in;
    json_t *ids = NULL;
    char id[300], msg[400];

    pthread_mutex_lock(&st->lock);
    if (injection_parse(st, body, now_ms, &in, ans) != 0)
        goto out;
    /* All or nothing: every id is checked before any intent is made. A
     * deleted intent's id stays taken, as ids are never reused. */
    for (long long i = 0; in.id_template && i < in.count; i++) {
        expand(in.id_template, in.start + i, id, sizeof(id));
        if (json_object_get(st->intents, id) || json_object_get(st->deleted, id)) {
            snprintf(msg, sizeof(msg), "A PaymentIntent with id '%s' exists already.",
                     id);
            pst_answer_error(ans, 409, "invalid_request_error",
                             "resource_already_exists", "id", msg);
            goto out;
        }
    }
    if (pst_index_reserve(&st->intent_index, (size_t)in.count) != 0 ||
        !(ids = json_array())) {
        pst_answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        goto out;
    }
    for (long long i = 0; i < in.count; i++) {
        if (in.id_template)
            expand(in.id_template, in.start + i, id, sizeof(id));
        else
            pst_fresh_id(st, "pi", st->intents, st->deleted, now_ms, id, sizeof(id));
        inject_intent(st, &in, id, in.start + i, now_ms);
        if (i < 100)
            json_array_append_new(ids, json_string(id));
    }
    pst_answer_json(ans, 201,
                    json_pack("{s:I, s:O}", "count", (json_int_t)in.count, "ids", ids));
out:
    if (st->journal)
        pst_journal(st, "inject_intents", now_ms, pst_body_record(body));
    pthread_mutex_unlock(&st->lock);
    json_decref(ids);
}

void psp_store_amend(psp_store_t *st, const char *id, json_t *body, int64_t now_ms,
                     struct psp_answer *ans)
{
    static const char *const names[] = {"amount", "currency", NULL};
    long long amount = 0;
    json_t *cur = json_object_get(body, "currency");

    if (members_known(body, names, ans) != 0 ||
        member_int(body, "amount", 1, AMOUNT_MAX, &amount, ans) != 0)
        return;
    if (!amount && !cur) {
        answer_bad(ans, NULL, "give amount, currency or both");
        return;
    }
    if (cur && !pst_currency_valid(json_string_value(cur))) {
        answer_bad(ans, "currency", "currency must be three lower-case letters");
        return;
    }
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->intents, id);
    if (!rec) {
        pst_answer_no_such_intent(ans, id);
        goto out;
    }
    pst_settle_if_due(st, rec, now_ms);
    json_t *pi = json_object_get(rec, "pi"), *row = json_object_get(rec, "row");
    if (amount) {
        json_object_set_new(pi, "amount", json_integer(amount));
        json_object_set_new(row, "amount", json_integer(amount));
        /* What an automatic intent received follows its amount. */
        const char *how = json_string_value(json_object_get(pi, "capture_method"));
        if (!how || !strcmp(how, "automatic"))
            pst_money_fields(pi, NULL);
    }
    if (cur) {
        json_object_set_new(pi, "currency", json_string(json_string_value(cur)));
        json_object_set_new(row, "currency", json_string(json_string_value(cur)));
    }
    json_object_set_new(row, "amended", json_true());
    pst_answer_json(ans, 200, json_incref(pi));
out:
    if (st->journal)
        pst_journal(st, "amend", now_ms, pst_id_and_body_record(id, body));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_delete(psp_store_t *st, const char *id, struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->intents, id);
    if (!rec) {
        pst_answer_no_such_intent(ans, id);
        goto out;
    }
    struct list_entry *e = pst_index_find(&st->intent_index, pst_rec_seq(rec));
    if (e)
        e->live = 0;
    json_object_set_new(json_object_get(rec, "row"), "deleted", json_true());
    /* Kept aside, out of every lookup but a list cursor's. */
    json_object_set(st->deleted, id, rec);
    json_object_del(st->processing, id);
    pst_answer_json(ans, 200, json_pack("{s:b, s:s}", "deleted", 1, "id", id));
    json_object_del(st->intents, id);
out:
    if (st->journal)
        pst_journal(st, "delete", 0, json_pack("{s:s}", "id", id));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_inject_refund(psp_store_t *st, json_t *body, int64_t now_ms,
                             struct psp_answer *ans)
{
    static const char *const names[] = {"payment_intent", "amount",  "status",
                                        "metadata",       "created", NULL};
    static const char *const statuses[] = {"succeeded", "pending", "failed"};
    const char *pi_id = json_string_value(json_object_get(body, "payment_intent"));
    const char *status = "succeeded";
    json_t *v, *md = json_object_get(body, "metadata");
    long long amount = 0, created = now_ms / 1000;
    char id[40], ch[300], key[64], msg[200];
    size_t i;

    if (members_known(body, names, ans) != 0)
        return;
    if (!pi_id) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                         "payment_intent",
                         "payment_intent must be a payment intent id");
        return;
    }
    if (member_int(body, "amount", 1, AMOUNT_MAX, &amount, ans) != 0 ||
        member_int(body, "created", 0, 253402300799LL, &created, ans) != 0 ||
        (md && metadata_valid(md, 0, ans) != 0))
        return;
    if ((v = json_object_get(body, "status")) != NULL) {
        status = json_string_value(v);
        for (i = 0; i < 3 && (!status || strcmp(status, statuses[i])); i++)
            ;
        if (i == 3) {
            answer_bad(ans, "status", "status must be succeeded, pending or failed");
            return;
        }
    }
    pthread_mutex_lock(&st->lock);
    json_t *irec = json_object_get(st->intents, pi_id);
    if (!irec) {
        pst_no_such("payment_intent", pi_id, msg, sizeof(msg));
        pst_answer_error(ans, 404, "invalid_request_error", "resource_missing",
                         "payment_intent", msg);
        goto out;
    }
    if (pst_index_reserve(&st->refund_index, 1) != 0) {
        pst_answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        goto out;
    }
    json_t *pi = json_object_get(irec, "pi");
    /* Out of band: no check of what is left to refund, nor of the intent's
     * status; that is the state an auditor must catch. */
    if (!amount)
        amount = json_integer_value(json_object_get(pi, "amount"));
    pst_fresh_id(st, "re", st->refunds, NULL, now_ms, id, sizeof(id));
    pst_charge_id_of(pi_id, ch, sizeof(ch));
    json_t *refund = json_pack(
        "{s:s, s:s, s:I, s:s, s:O, s:s, s:s, s:n, s:o, s:I}", "id", id, "object",
        "refund", "amount", (json_int_t)amount, "charge", ch, "currency",
        json_object_get(pi, "currency"), "payment_intent", pi_id, "status", status,
        "reason", "metadata", md ? json_deep_copy(md) : json_object(), "created",
        (json_int_t)created);
    if (!strcmp(status, "failed"))
        json_object_set_new(refund, "failure_reason",
                            json_string("lost_or_stolen_card"));
    snprintf(key, sizeof(key), "inject_%s", id);
    json_t *row = json_pack(
        "{s:s, s:s, s:s, s:I, s:O, s:n, s:O, s:s, s:O?, s:i, s:I, s:n, s:b}",
        "idempotency_key", key, "provider_refund_id", id, "payment_intent_id", pi_id,
        "amount", (json_int_t)amount, "currency", json_object_get(pi, "currency"),
        "reason", "metadata", json_object_get(refund, "metadata"), "status", status,
        "failure_reason", json_object_get(refund, "failure_reason"), "http_status", 200,
        "at_ms", (json_int_t)now_ms, "settled_at_ms", "injected", 1);
    pst_add_refund(st, irec, refund, row,
                   created == now_ms / 1000 ? now_ms : (int64_t)created * 1000,
                   "succeeded");
    pst_count_refund_status(st, status, 1);
    pst_answer_json(ans, 201, json_incref(refund));
out:
    if (st->journal)
        pst_journal(st, "inject_refund", now_ms, pst_body_record(body));
    pthread_mutex_unlock(&st->lock);
}
