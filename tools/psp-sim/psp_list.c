/* psp_list: the store's list pages (GET /v1/payment_intents and
 * GET /v1/refunds): the index of objects in creation order and the
 * selection of one page from it. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psp_store_internal.h"

/* Caller holds the lock. Room for `more` entries: 0, or -1 out of memory. */
int pst_index_reserve(struct list_index *ix, size_t more)
{
    size_t cap = ix->cap ? ix->cap : 1024;
    if (ix->cap - ix->n >= more)
        return 0;
    while (cap - ix->n < more)
        cap *= 2;
    struct list_entry *v = realloc(ix->v, cap * sizeof(*v));
    if (!v)
        return -1;
    ix->v = v;
    ix->cap = cap;
    return 0;
}

/* Caller holds the lock and has reserved the room. */
void pst_index_append(struct list_index *ix, int64_t created, int64_t seq, json_t *rec)
{
    ix->v[ix->n++] = (struct list_entry){created, seq, rec, 1};
}

/* Caller holds the lock. Entries are appended as seq grows: sorted by it. */
struct list_entry *pst_index_find(struct list_index *ix, int64_t seq)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->v[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ix->n && ix->v[lo].seq == seq ? &ix->v[lo] : NULL;
}

/* The lists' order, newest first: by created, then by creation (seq), so
 * an intent injected with an earlier created sits where Stripe's would. */
static int newer(const struct list_entry *a, const struct list_entry *b)
{
    return a->created != b->created ? a->created > b->created : a->seq > b->seq;
}

static int newest_first(const void *a, const void *b)
{
    const struct list_entry *x = *(const struct list_entry *const *)a;
    const struct list_entry *y = *(const struct list_entry *const *)b;
    return newer(x, y) ? -1 : newer(y, x) ? 1 : 0;
}

static void heap_swap_entries(const struct list_entry **h, size_t a, size_t b)
{
    const struct list_entry *t = h[a];
    h[a] = h[b];
    h[b] = t;
}

/* A heap whose root is the oldest entry kept. */
static void heap_up(const struct list_entry **h, size_t i)
{
    while (i > 0 && newer(h[(i - 1) / 2], h[i])) {
        heap_swap_entries(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(const struct list_entry **h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && newer(h[m], h[l]))
            m = l;
        if (r < n && newer(h[m], h[r]))
            m = r;
        if (m == i)
            return;
        heap_swap_entries(h, i, m);
        i = m;
    }
}

/* Caller holds the lock. The k newest live entries the scan accepts, newest
 * first, into page (room for k); returns how many. One pass keeping only
 * the k newest seen, so a page costs O(n), not a sort of all the matches.
 * From the last created back: once the heap is full, the older ones are
 * turned away at the first comparison. */
size_t pst_select_page(const struct list_index *ix, const struct list_scan *s,
                       const struct list_entry **page, size_t k)
{
    const struct list_entry cursor = {s->after_created, s->after_seq, NULL, 0};
    size_t n = 0;

    for (size_t i = ix->n; i-- > 0;) {
        const struct list_entry *e = &ix->v[i];
        if (!e->live || e->created < s->created_gte || e->created >= s->created_lt ||
            (s->after_seq >= 0 && !newer(&cursor, e)) ||
            (n == k && !newer(e, page[0])) || (s->keep && !s->keep(e->rec, s->want)))
            continue;
        if (n < k) {
            page[n] = e;
            heap_up(page, n++);
        } else {
            page[0] = e;
            heap_down(page, n, 0);
        }
    }
    qsort(page, n, sizeof(*page), newest_first);
    return n;
}

json_int_t pst_rec_seq(json_t *rec)
{
    return json_integer_value(json_object_get(rec, "seq"));
}

static int intent_of_customer(json_t *rec, const char *customer)
{
    const char *c =
        json_string_value(json_object_get(json_object_get(rec, "pi"), "customer"));
    return c && !strcmp(c, customer);
}

void psp_store_list(psp_store_t *st, const struct psp_list_query *q, int64_t now_ms,
                    struct psp_answer *ans)
{
    const struct list_entry *page[LIST_MAX + 1];
    int limit = q->limit < 1 ? 1 : q->limit > LIST_MAX ? LIST_MAX : q->limit;
    struct list_scan scan = {
        q->created_gte, q->created_lt, 0, -1, q->customer ? intent_of_customer : NULL,
        q->customer};
    json_t *data = json_array();

    pthread_mutex_lock(&st->lock);
    if (q->starting_after) {
        /* A deleted intent keeps its place: a client may hold it as its
         * cursor across pages. */
        json_t *cursor = json_object_get(st->intents, q->starting_after);
        if (!cursor)
            cursor = json_object_get(st->deleted, q->starting_after);
        if (!cursor) {
            char msg[128];
            pst_no_such("payment_intent", q->starting_after, msg, sizeof(msg));
            pst_answer_error(ans, 400, "invalid_request_error", "resource_missing",
                             "starting_after", msg);
            goto out;
        }
        scan.after_created = json_integer_value(
            json_object_get(json_object_get(cursor, "pi"), "created"));
        scan.after_seq = pst_rec_seq(cursor);
    }
    /* Every intent, at once: unlike search, the list does not lag. */
    size_t n = pst_select_page(&st->intent_index, &scan, page, (size_t)limit + 1);
    for (size_t i = 0; i < n && i < (size_t)limit; i++) {
        pst_settle_if_due(st, page[i]->rec, now_ms);
        /* A copy: the answer is serialised after we let go of the lock. */
        json_array_append_new(data,
                              json_deep_copy(json_object_get(page[i]->rec, "pi")));
    }
    pst_answer_json(ans, 200,
                    json_pack("{s:s, s:s, s:b, s:O}", "object", "list", "url",
                              "/v1/payment_intents", "has_more", n > (size_t)limit,
                              "data", data));
out:
    pthread_mutex_unlock(&st->lock);
    json_decref(data);
}
