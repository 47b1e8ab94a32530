#include "dlq_reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <librdkafka/rdkafka.h>

#include "card_data.h"
#include "clock.h"
#include "decimal.h"
#include "kafka_setup.h"

#define KAFKA_TIMEOUT_MS  10000
#define REPLAY_TIMEOUT_MS 30000
/* A read polls this long, then asks where the partitions stand: a
 * partition can end in offsets no consumer receives (transaction markers,
 * aborted letters), seen only as the position moving past them. */
#define POLL_SLICE_MS 100
/* The client chargectl always was: the console's reads and replays look
 * the same to the brokers. */
#define CLIENT_ID "chargectl"

/* A letter and what it points into; each one allocated on its own, so
 * that a letter's address outlives later reads. */
struct slot {
    struct dlq_letter l; /* first: a letter's address is its slot's */
    rd_kafka_headers_t *headers;
    int summary; /* read by dlq_reader_read_newest: the value is not kept */
};

/* One partition's offsets [from, to) to read; want (sorted, nwant of
 * them), when given, the only ones kept. */
struct span {
    int32_t partition;
    int64_t from, to;
    const int64_t *want;
    size_t nwant;
};

struct dlq_reader {
    const config_t *cfg;
    const char *topic;
    rd_kafka_t *consumer;
    struct slot **slots;
    size_t n, cap;
    int64_t total; /* offsets in the partitions at the last whole/newest read */
};

static void slot_free(struct slot *s)
{
    if (!s)
        return;
    free((char *)s->l.key);
    free((char *)s->l.value);
    if (s->headers)
        rd_kafka_headers_destroy(s->headers);
    free(s);
}

static const char *header(rd_kafka_headers_t *h, const char *name)
{
    const void *v;
    size_t sz;
    /* Header values we wrote are NUL-free text; librdkafka keeps a NUL after
     * each value, so the pointer can be used as a string. */
    if (!h ||
        rd_kafka_header_get_last(h, name, &v, &sz) != RD_KAFKA_RESP_ERR_NO_ERROR || !v)
        return NULL;
    return v;
}

static void take_ids(struct dlq_letter *l)
{
    json_t *doc = l->value ? json_loadb(l->value, l->value_len, 0, NULL) : NULL;
    const char *a = json_string_value(json_object_get(doc, "payment_attempt_id"));
    const char *o = json_string_value(json_object_get(doc, "order_id"));
    snprintf(l->attempt, sizeof(l->attempt), "%s", a ? a : "");
    snprintf(l->order, sizeof(l->order), "%s", o ? o : "");
    if (!a && l->key && l->key_len == 36) {
        memcpy(l->attempt, l->key, 36);
        l->attempt[36] = '\0';
    }
    json_decref(doc);
}

static char *copy_bytes(const void *p, size_t n)
{
    char *c = malloc(n + 1);
    if (!c)
        return NULL;
    memcpy(c, p, n);
    c[n] = '\0';
    return c;
}

static int keep(dlq_reader_t *r, const rd_kafka_message_t *m, int summary)
{
    rd_kafka_headers_t *h = NULL;
    struct slot *s;
    char *key = NULL, *value = NULL;
    if (r->n == r->cap) {
        size_t ncap = r->cap ? r->cap * 2 : 64;
        struct slot **ns = realloc(r->slots, ncap * sizeof(*ns));
        if (!ns)
            return -1;
        r->slots = ns;
        r->cap = ncap;
    }
    if (!(s = calloc(1, sizeof(*s))))
        return -1;
    if ((m->key && !(key = copy_bytes(m->key, m->key_len))) ||
        (m->payload && !(value = copy_bytes(m->payload, m->len)))) {
        free(key);
        free(value);
        free(s);
        return -1;
    }
    struct dlq_letter *l = &s->l;
    l->partition = m->partition;
    l->offset = m->offset;
    l->timestamp_ms = rd_kafka_message_timestamp(m, NULL);
    l->key = key;
    l->key_len = key ? m->key_len : 0;
    l->value = value;
    l->value_len = value ? m->len : 0;
    if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR)
        s->headers = rd_kafka_headers_copy(h);
    l->reason = header(s->headers, "dlq.reason");
    l->error = header(s->headers, "dlq.error");
    l->failed_at = header(s->headers, "dlq.failed_at");
    l->orig_topic = header(s->headers, "dlq.original.topic");
    l->orig_partition = header(s->headers, "dlq.original.partition");
    l->orig_offset = header(s->headers, "dlq.original.offset");
    if (!l->failed_at || clock_parse_rfc3339(l->failed_at, &l->failed_at_ms) != 0)
        l->failed_at_ms = l->timestamp_ms;
    take_ids(l);
    if (summary) {
        /* The ids are taken: a summary needs no more of the value, which
         * can be Kafka's whole message size. */
        free(value);
        l->value = NULL;
        l->value_len = 0;
        s->summary = 1;
    }
    r->slots[r->n++] = s;
    return 0;
}

dlq_reader_t *dlq_reader_new(const config_t *cfg, char *err, size_t err_size)
{
    dlq_reader_t *r = calloc(1, sizeof(*r));
    rd_kafka_conf_t *conf = NULL;
    if (!r) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    r->cfg = cfg;
    r->topic = config_str(cfg, CONFIG_CHARGE_DLQ_TOPIC);
    if (!(conf = kafka_setup_conf(cfg, CLIENT_ID, err, err_size)))
        goto out;
    kafka_setup_apply_env(conf, cfg);
    /* A group id is required by the API; with assign() and no commits the
     * group never sees us. */
    if (kafka_setup_set(conf, "group.id", "chargectl-dlq-reader", err, err_size) ||
        kafka_setup_set(conf, "enable.auto.commit", "false", err, err_size) ||
        kafka_setup_set(conf, "enable.auto.offset.store", "false", err, err_size) ||
        /* Letters of a transaction not committed (or aborted) are not
         * letters; the end offset is then the last stable one. */
        kafka_setup_set(conf, "isolation.level", "read_committed", err, err_size) ||
        /* A read asks for what is there: the broker need not wait for more. */
        kafka_setup_set(conf, "fetch.wait.max.ms", "10", err, err_size) ||
        /* What is fetched ahead stays small: a console reads in many
         * requests at once. */
        kafka_setup_set(conf, "queued.max.messages.kbytes", "4096", err, err_size) ||
        kafka_setup_set(conf, "fetch.max.bytes", "4194304", err, err_size))
        goto out;
    if (!(r->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, err_size)))
        goto out;
    return r;
out:
    if (conf)
        rd_kafka_conf_destroy(conf);
    free(r);
    return NULL;
}

void dlq_reader_free(dlq_reader_t *r)
{
    if (!r)
        return;
    if (r->consumer) {
        rd_kafka_consumer_close(r->consumer);
        rd_kafka_destroy(r->consumer);
    }
    for (size_t i = 0; i < r->n; i++)
        slot_free(r->slots[i]);
    free(r->slots);
    free(r);
}

size_t dlq_reader_count(const dlq_reader_t *r)
{
    return r->n;
}

const struct dlq_letter *dlq_reader_letter(const dlq_reader_t *r, size_t i)
{
    return i < r->n ? &r->slots[i]->l : NULL;
}

/* Partition count of the DLQ topic, or -1 when Kafka does not answer. */
static int dlq_partitions(dlq_reader_t *r, char *err, size_t err_size)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *t = rd_kafka_topic_new(r->consumer, r->topic, NULL);
    rd_kafka_resp_err_t e = rd_kafka_metadata(r->consumer, 0, t, &md, KAFKA_TIMEOUT_MS);
    int n = -1;
    if (e) {
        snprintf(err, err_size, "kafka unreachable at %s: %s",
                 config_str(r->cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS),
                 rd_kafka_err2str(e));
    } else if (md->topic_cnt < 1 || md->topics[0].err) {
        snprintf(err, err_size, "dead-letter topic '%s' does not exist", r->topic);
    } else {
        n = md->topics[0].partition_cnt;
    }
    if (md)
        rd_kafka_metadata_destroy(md);
    if (t)
        rd_kafka_topic_destroy(t);
    return n;
}

static void unassign(dlq_reader_t *r, int32_t partition)
{
    rd_kafka_topic_partition_list_t *one = rd_kafka_topic_partition_list_new(1);
    rd_kafka_error_t *e;
    if (!one)
        return;
    rd_kafka_topic_partition_list_add(one, r->topic, partition);
    if ((e = rd_kafka_incremental_unassign(r->consumer, one)))
        rd_kafka_error_destroy(e);
    rd_kafka_topic_partition_list_destroy(one);
}

static int watermarks(dlq_reader_t *r, int32_t p, int64_t *lo, int64_t *hi, char *err,
                      size_t err_size)
{
    rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(r->consumer, r->topic, p,
                                                             lo, hi, KAFKA_TIMEOUT_MS);
    if (e)
        snprintf(err, err_size, "cannot read offsets of %s [%d]: %s", r->topic, (int)p,
                 rd_kafka_err2str(e));
    return e ? -1 : 0;
}

static int wanted(const struct span *s, int64_t offset)
{
    if (offset < s->from || offset >= s->to)
        return 0;
    if (!s->want)
        return 1;
    size_t lo = 0, hi = s->nwant;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->want[mid] == offset)
            return 1;
        if (s->want[mid] < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* Reads the spans (one per partition at most, each from < to, partitions
 * below np), keeping what they want. A span is read once a letter at or
 * past its end arrives or the consumer's position reaches its end (the
 * offsets before can be markers no one receives); ten seconds without
 * either is Kafka not answering. */
static enum dlq_reader_rc read_spans(dlq_reader_t *r, int np, const struct span *sp,
                                     size_t nsp, int summary, char *err,
                                     size_t err_size)
{
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new((int)nsp);
    rd_kafka_topic_partition_list_t *pos = NULL;
    int *idx = malloc(((size_t)np + 1) * sizeof(*idx));
    char *done = calloc(nsp + 1, 1);
    int64_t *base = calloc(nsp + 1, sizeof(*base));
    size_t open = 0;
    int assigned = 0;
    enum dlq_reader_rc rc = DLQ_READER_UNREACHABLE;
    if (!list || !idx || !done || !base) {
        snprintf(err, err_size, "out of memory");
        rc = DLQ_READER_FAILED;
        goto out;
    }
    for (int p = 0; p < np; p++)
        idx[p] = -1;
    for (size_t i = 0; i < nsp; i++) {
        idx[sp[i].partition] = (int)i;
        rd_kafka_topic_partition_list_add(list, r->topic, sp[i].partition)->offset =
            sp[i].from;
        open++;
    }
    if (open == 0) {
        rc = DLQ_READER_OK;
        goto out;
    }
    rd_kafka_error_t *ae = rd_kafka_incremental_assign(r->consumer, list);
    if (ae) {
        snprintf(err, err_size, "cannot read '%s': %s", r->topic,
                 rd_kafka_error_string(ae));
        rd_kafka_error_destroy(ae);
        goto out;
    }
    assigned = 1;
    /* The position as assigned: one left from an earlier read of the
     * partition says nothing about this one. */
    rd_kafka_position(r->consumer, list);
    for (size_t i = 0; i < nsp; i++)
        base[i] = list->elems[i].err ? RD_KAFKA_OFFSET_INVALID : list->elems[i].offset;
    int64_t deadline = clock_now_ms() + KAFKA_TIMEOUT_MS;
    while (open > 0) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(r->consumer, POLL_SLICE_MS);
        if (m) {
            int i = m->err || m->partition < 0 || m->partition >= np
                        ? -1
                        : idx[m->partition];
            /* A span counts as read once, whatever arrives after its end
             * (letters produced meanwhile, fetched before it was
             * unassigned). */
            if (i >= 0 && !done[i]) {
                deadline = clock_now_ms() + KAFKA_TIMEOUT_MS;
                if (wanted(&sp[i], m->offset) && keep(r, m, summary) != 0) {
                    rd_kafka_message_destroy(m);
                    snprintf(err, err_size, "out of memory");
                    rc = DLQ_READER_FAILED;
                    goto out;
                }
                if (m->offset + 1 >= sp[i].to) {
                    done[i] = 1;
                    open--;
                    unassign(r, sp[i].partition);
                }
            }
            rd_kafka_message_destroy(m);
            continue;
        }
        /* Nothing came: a span whose position is past its last letter
         * ended in offsets that are not letters. */
        if (pos)
            rd_kafka_topic_partition_list_destroy(pos);
        if (!(pos = rd_kafka_topic_partition_list_new((int)open))) {
            snprintf(err, err_size, "out of memory");
            rc = DLQ_READER_FAILED;
            goto out;
        }
        for (size_t i = 0; i < nsp; i++)
            if (!done[i])
                rd_kafka_topic_partition_list_add(pos, r->topic, sp[i].partition);
        rd_kafka_position(r->consumer, pos);
        for (int k = 0; k < pos->cnt; k++) {
            int i = idx[pos->elems[k].partition];
            if (pos->elems[k].err || pos->elems[k].offset < sp[i].to ||
                pos->elems[k].offset == base[i])
                continue;
            done[i] = 1;
            open--;
            unassign(r, sp[i].partition);
            deadline = clock_now_ms() + KAFKA_TIMEOUT_MS;
        }
        if (open > 0 && clock_now_ms() >= deadline) {
            snprintf(err, err_size, "kafka stopped answering while reading '%s'",
                     r->topic);
            goto out;
        }
    }
    rc = DLQ_READER_OK;
out:
    /* Nothing stays assigned: the next read starts from its own offsets. */
    for (size_t i = 0; assigned && i < nsp; i++)
        if (!done[i])
            unassign(r, sp[i].partition);
    if (pos)
        rd_kafka_topic_partition_list_destroy(pos);
    free(base);
    free(done);
    free(idx);
    if (list)
        rd_kafka_topic_partition_list_destroy(list);
    return rc;
}

/* Reads the newest max offsets of every partition (max < 0: all of them),
 * counting every offset there is in r->total. */
static enum dlq_reader_rc read_newest(dlq_reader_t *r, int64_t max, int summary,
                                      char *err, size_t err_size)
{
    int np = dlq_partitions(r, err, err_size);
    if (np < 0)
        return DLQ_READER_UNREACHABLE;
    struct span *sp = calloc((size_t)np + 1, sizeof(*sp));
    size_t nsp = 0;
    int64_t total = 0;
    enum dlq_reader_rc rc = DLQ_READER_UNREACHABLE;
    if (!sp) {
        snprintf(err, err_size, "out of memory");
        return DLQ_READER_FAILED;
    }
    for (int p = 0; p < np; p++) {
        int64_t lo, hi;
        if (watermarks(r, p, &lo, &hi, err, err_size) != 0)
            goto out;
        total += hi - lo;
        if (max >= 0 && hi - lo > max)
            lo = hi - max;
        if (hi > lo)
            sp[nsp++] = (struct span){.partition = p, .from = lo, .to = hi};
    }
    rc = read_spans(r, np, sp, nsp, summary, err, err_size);
    if (rc == DLQ_READER_OK)
        r->total = total;
out:
    free(sp);
    return rc;
}

enum dlq_reader_rc dlq_reader_read_all(dlq_reader_t *r, char *err, size_t err_size)
{
    return read_newest(r, -1, 0, err, err_size);
}

enum dlq_reader_rc dlq_reader_read_newest(dlq_reader_t *r, int64_t max_per_partition,
                                          char *err, size_t err_size)
{
    return read_newest(r, max_per_partition < 0 ? 0 : max_per_partition, 1, err,
                       err_size);
}

int64_t dlq_reader_total(const dlq_reader_t *r)
{
    return r->total;
}

/* Wanted offsets closer than this are read as one span (reading a few
 * offsets too many is cheaper than another assign). */
#define SPAN_GAP 64

struct want {
    int32_t partition;
    int64_t offset;
};

static int cmp_want(const void *a, const void *b)
{
    const struct want *x = a, *y = b;
    if (x->partition != y->partition)
        return x->partition < y->partition ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static const struct dlq_letter *found(const dlq_reader_t *r, size_t from, int32_t p,
                                      int64_t o)
{
    for (size_t j = from; j < r->n; j++)
        if (r->slots[j]->l.partition == p && r->slots[j]->l.offset == o)
            return &r->slots[j]->l;
    return NULL;
}

enum dlq_reader_rc dlq_reader_read_positions(dlq_reader_t *r, const int32_t *partitions,
                                             const int64_t *offsets, size_t n,
                                             const struct dlq_letter **letters,
                                             char *err, size_t err_size)
{
    struct want *w = calloc(n + 1, sizeof(*w));
    int64_t *offs = calloc(n + 1, sizeof(*offs));
    int64_t *lo = NULL, *hi = NULL;
    struct span *sp = NULL;
    size_t *at = NULL, *end = NULL; /* per partition: its next run, its last */
    size_t before = r->n, nw = 0;
    enum dlq_reader_rc rc = DLQ_READER_FAILED;
    int np = 0;
    if (!w || !offs) {
        snprintf(err, err_size, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (partitions[i] < 0 || offsets[i] < 0) {
            snprintf(err, err_size, "no dead letter at %d:%lld", (int)partitions[i],
                     (long long)offsets[i]);
            rc = DLQ_READER_NOT_FOUND;
            goto out;
        }
    }
    if (n == 0) {
        rc = DLQ_READER_OK;
        goto out;
    }
    rc = DLQ_READER_UNREACHABLE;
    if ((np = dlq_partitions(r, err, err_size)) < 0)
        goto out;
    lo = calloc((size_t)np + 1, sizeof(*lo));
    hi = calloc((size_t)np + 1, sizeof(*hi));
    sp = calloc((size_t)np + 1, sizeof(*sp));
    at = calloc((size_t)np + 1, sizeof(*at));
    end = calloc((size_t)np + 1, sizeof(*end));
    if (!lo || !hi || !sp || !at || !end) {
        snprintf(err, err_size, "out of memory");
        rc = DLQ_READER_FAILED;
        goto out;
    }
    for (int p = 0; p < np; p++)
        lo[p] = hi[p] = -1;
    /* Every position is checked against its partition before any is read. */
    for (size_t i = 0; i < n; i++) {
        int32_t p = partitions[i];
        if (p >= np) {
            snprintf(err, err_size, "no partition %d in '%s' (it has %d)", (int)p,
                     r->topic, np);
            rc = DLQ_READER_NOT_FOUND;
            goto out;
        }
        if (hi[p] < 0 && watermarks(r, p, &lo[p], &hi[p], err, err_size) != 0)
            goto out;
        if (offsets[i] < lo[p] || offsets[i] >= hi[p]) {
            snprintf(err, err_size,
                     "no dead letter at %d:%lld (partition holds %lld..%lld)", (int)p,
                     (long long)offsets[i], (long long)lo[p], (long long)hi[p] - 1);
            rc = DLQ_READER_NOT_FOUND;
            goto out;
        }
        w[nw++] = (struct want){p, offsets[i]};
    }
    qsort(w, nw, sizeof(*w), cmp_want);
    for (size_t i = 0; i < nw; i++)
        offs[i] = w[i].offset;
    /* Rounds: each reads the next run of close offsets of every partition
     * at once, so that 500 neighbouring positions cost one read. */
    for (size_t i = 0; i < nw; i++) {
        if (i == 0 || w[i].partition != w[i - 1].partition)
            at[w[i].partition] = i;
        end[w[i].partition] = i + 1;
    }
    rc = DLQ_READER_OK;
    for (;;) {
        size_t nsp = 0;
        for (int p = 0; p < np; p++) {
            size_t a = at[p], b = a;
            if (a >= end[p])
                continue;
            while (b + 1 < end[p] && offs[b + 1] - offs[b] <= SPAN_GAP)
                b++;
            sp[nsp++] = (struct span){.partition = p,
                                      .from = offs[a],
                                      .to = offs[b] + 1,
                                      .want = offs + a,
                                      .nwant = b + 1 - a};
            at[p] = b + 1;
        }
        if (nsp == 0 ||
            (rc = read_spans(r, np, sp, nsp, 0, err, err_size)) != DLQ_READER_OK)
            break;
    }
    if (rc != DLQ_READER_OK)
        goto out;
    /* A position inside the partition can still hold no letter (a
     * transaction marker, an aborted letter). */
    for (size_t i = 0; i < n; i++) {
        const struct dlq_letter *l = found(r, before, partitions[i], offsets[i]);
        if (!l) {
            snprintf(err, err_size, "no dead letter at %d:%lld", (int)partitions[i],
                     (long long)offsets[i]);
            rc = DLQ_READER_NOT_FOUND;
            goto out;
        }
        if (letters)
            letters[i] = l;
    }
out:
    free(end);
    free(at);
    free(sp);
    free(hi);
    free(lo);
    free(offs);
    free(w);
    return rc;
}

enum dlq_reader_rc dlq_reader_read_one(dlq_reader_t *r, int32_t partition,
                                       int64_t offset, char *err, size_t err_size)
{
    return dlq_reader_read_positions(r, &partition, &offset, 1, NULL, err, err_size);
}

static int matches(const struct dlq_letter *l, const struct dlq_filters *f)
{
    if (f->reason && (!l->reason || strcmp(l->reason, f->reason) != 0))
        return 0;
    if (f->attempt && strcasecmp(l->attempt, f->attempt) != 0)
        return 0;
    if (f->order && strcasecmp(l->order, f->order) != 0)
        return 0;
    if (f->have_since && l->failed_at_ms < f->since_ms)
        return 0;
    if (f->have_until && l->failed_at_ms >= f->until_ms)
        return 0;
    return 1;
}

static int cmp_time(const void *a, const void *b)
{
    const struct dlq_letter *x = *(const struct dlq_letter *const *)a,
                            *y = *(const struct dlq_letter *const *)b;
    if (x->failed_at_ms != y->failed_at_ms)
        return x->failed_at_ms < y->failed_at_ms ? -1 : 1;
    if (x->partition != y->partition)
        return x->partition < y->partition ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

const struct dlq_letter **dlq_reader_select(const dlq_reader_t *r,
                                            const struct dlq_filters *f, size_t *count)
{
    const struct dlq_letter **sel = calloc(r->n + 1, sizeof(*sel));
    size_t n = 0;
    if (!sel)
        return NULL;
    for (size_t i = 0; i < r->n; i++)
        if (matches(&r->slots[i]->l, f))
            sel[n++] = &r->slots[i]->l;
    qsort(sel, n, sizeof(*sel), cmp_time);
    if (f->limit > 0 && n > (size_t)f->limit) {
        memmove(sel, sel + (n - (size_t)f->limit), (size_t)f->limit * sizeof(*sel));
        n = (size_t)f->limit;
    }
    *count = n;
    return sel;
}

/* Anything but the exact form is refused rather than clamped into a
 * position that names another letter. */
int dlq_position_parse(const char *s, int32_t *partition, int64_t *offset)
{
    const char *rest;
    int64_t part, off;
    if (decimal_parse(s, INT32_MAX, &part, &rest) != 0 || *rest != ':' ||
        decimal_parse(rest + 1, INT64_MAX, &off, NULL) != 0)
        return -1;
    *partition = (int32_t)part;
    *offset = off;
    return 0;
}

/* ---- JSON ---- */

/* A copy of n bytes at p, card numbers masked when mask (NULL for NULL or
 * out of memory: the caller shows null rather than the digits). */
static char *masked_copy(const char *p, size_t n, int mask)
{
    char *c = p ? copy_bytes(p, n) : NULL;
    if (c && mask)
        card_data_mask_loose(c, n);
    return c;
}

/* Bytes as a JSON value: the parsed JSON, a string, or {"hex": ...}. */
static json_t *bytes_json(const char *p, size_t n, int parse)
{
    if (!p)
        return json_null();
    if (parse) {
        json_t *doc = json_loadb(p, n, 0, NULL);
        if (doc)
            return doc;
    }
    json_t *s = json_stringn(p, n);
    if (s)
        return s;
    char *h = malloc(2 * n + 1);
    for (size_t i = 0; h && i < n; i++)
        sprintf(h + 2 * i, "%02x", (unsigned char)p[i]);
    s = json_pack("{s:s}", "hex", h ? h : "");
    free(h);
    return s;
}

/* bytes_json of a copy, masked when mask. */
static json_t *shown_json(const char *p, size_t n, int parse, int mask)
{
    if (!p)
        return json_null();
    if (!mask)
        return bytes_json(p, n, parse);
    char *c = masked_copy(p, n, 1);
    json_t *j = c ? bytes_json(c, n, parse) : json_null();
    free(c);
    return j;
}

static json_t *headers_json(rd_kafka_headers_t *h, int mask)
{
    json_t *arr = json_array();
    const char *name;
    const void *val;
    size_t sz;
    for (size_t i = 0; h && !rd_kafka_header_get_all(h, i, &name, &val, &sz); i++) {
        json_t *n = shown_json(name, strlen(name), 0, mask);
        json_array_append_new(arr,
                              json_pack("[o, o]", n, shown_json(val, sz, 0, mask)));
    }
    return arr;
}

/* A string member's value, masked when mask; NULL when s is. */
static json_t *text_json(const char *s, int mask)
{
    return s ? shown_json(s, strlen(s), 0, mask) : NULL;
}

static json_t *summary_json(const struct dlq_letter *l, int mask)
{
    char pos[48];
    snprintf(pos, sizeof(pos), "%d:%lld", (int)l->partition, (long long)l->offset);
    return json_pack(
        "{s:s, s:i, s:I, s:o?, s:o?, s:o?, s:o?, s:o?, s:{s:o?, s:o?, s:o?}}",
        "position", pos, "partition", (int)l->partition, "offset",
        (json_int_t)l->offset, "failed_at", text_json(l->failed_at, mask), "reason",
        text_json(l->reason, mask), "payment_attempt_id",
        text_json(l->attempt[0] ? l->attempt : NULL, mask), "order_id",
        text_json(l->order[0] ? l->order : NULL, mask), "error",
        text_json(l->error, mask), "original", "topic", text_json(l->orig_topic, mask),
        "partition", text_json(l->orig_partition, mask), "offset",
        text_json(l->orig_offset, mask));
}

/* Masked too: the summary is printed and shown (chargectl dlq list, the
 * console's list), and an error or header may quote a card number. */
json_t *dlq_letter_summary_json(const struct dlq_letter *l)
{
    return summary_json(l, 1);
}

static const struct slot *slot_of(const struct dlq_letter *l)
{
    return (const struct slot *)l;
}

json_t *dlq_letter_json(const dlq_reader_t *r, const struct dlq_letter *l,
                        int mask_card_digits)
{
    (void)r;
    json_t *j = summary_json(l, mask_card_digits);
    if (!j)
        return NULL;
    json_object_set_new(j, "timestamp_ms", json_integer(l->timestamp_ms));
    json_object_set_new(j, "headers",
                        headers_json(slot_of(l)->headers, mask_card_digits));
    json_object_set_new(j, "key", shown_json(l->key, l->key_len, 0, mask_card_digits));
    json_object_set_new(j, "value",
                        shown_json(l->value, l->value_len, 1, mask_card_digits));
    return j;
}

/* ---- replay ---- */

static int is_card_letter(const struct dlq_letter *l)
{
    return l->reason && !strcmp(l->reason, "card_data_refused");
}

/* The headers a replay of l carries: the original ones (without the dlq.*
 * ones the worker added) plus where it comes from and who sent it. NULL
 * when out of memory. */
static rd_kafka_headers_t *replay_headers(const dlq_reader_t *r,
                                          const struct dlq_letter *l, const char *actor)
{
    rd_kafka_headers_t *src = slot_of(l)->headers;
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    const char *name;
    const void *val;
    size_t sz;
    char from[320];
    if (!h)
        return NULL;
    for (size_t k = 0; src && !rd_kafka_header_get_all(src, k, &name, &val, &sz); k++)
        if (strncmp(name, "dlq.", 4) != 0)
            rd_kafka_header_add(h, name, -1, val, val ? (ssize_t)sz : 0);
    snprintf(from, sizeof(from), "%s:%d:%lld", r->topic, (int)l->partition,
             (long long)l->offset);
    if (rd_kafka_header_add(h, "dlq.replayed_from", -1, from, -1) ||
        rd_kafka_header_add(h, "dlq.replayed_by", -1, actor ? actor : "", -1)) {
        rd_kafka_headers_destroy(h);
        return NULL;
    }
    return h;
}

json_t *dlq_replay_message_json(const dlq_reader_t *r, const struct dlq_letter *l,
                                const char *actor, int mask_card_digits)
{
    rd_kafka_headers_t *h = replay_headers(r, l, actor);
    json_t *j = NULL;
    if (!h)
        return NULL;
    j = json_pack("{s:o?, s:o, s:o, s:o}", "topic",
                  text_json(l->orig_topic, mask_card_digits), "key",
                  shown_json(l->key, l->key_len, 0, mask_card_digits), "value",
                  shown_json(l->value, l->value_len, 1, mask_card_digits), "headers",
                  headers_json(h, mask_card_digits));
    rd_kafka_headers_destroy(h);
    return j;
}

enum dlq_reader_rc dlq_reader_replay(dlq_reader_t *r,
                                     const struct dlq_letter *const *letters, size_t n,
                                     const char *actor, int dry_run,
                                     struct dlq_replay_item *items, char *err,
                                     size_t err_size)
{
    struct kafka_setup_delivery *sent = NULL;
    rd_kafka_t *rk = NULL;
    enum dlq_reader_rc rc = DLQ_READER_FAILED;
    size_t failed = 0;

    if (!actor || !*actor) {
        snprintf(err, err_size, "a replay needs an actor (dlq.replayed_by)");
        return DLQ_READER_REFUSED;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&items[i], 0, sizeof(items[i]));
        items[i].letter = letters[i];
    }
    /* Refuse what cannot be replayed before sending anything. Only the
     * command topic takes a replay: the header is the letter's word, and
     * anyone who can write a letter could name the results topic. */
    const char *commands = config_str(r->cfg, CONFIG_CHARGE_COMMANDS_TOPIC);
    for (size_t i = 0; i < n; i++) {
        if (!letters[i]->orig_topic) {
            snprintf(err, err_size, "%d:%lld has no dlq.original.topic",
                     (int)letters[i]->partition, (long long)letters[i]->offset);
            return DLQ_READER_REFUSED;
        }
        if (!commands || strcmp(letters[i]->orig_topic, commands) != 0) {
            snprintf(err, err_size,
                     "%d:%lld names topic '%.*s', not the command topic '%s': "
                     "a replay only produces to the command topic",
                     (int)letters[i]->partition, (long long)letters[i]->offset, 120,
                     letters[i]->orig_topic, commands ? commands : "");
            return DLQ_READER_REFUSED;
        }
        if (slot_of(letters[i])->summary) {
            snprintf(err, err_size, "%d:%lld was read without its value",
                     (int)letters[i]->partition, (long long)letters[i]->offset);
            return DLQ_READER_REFUSED;
        }
        if (is_card_letter(letters[i])) {
            items[i].skipped = 1;
            snprintf(items[i].error, sizeof(items[i].error), "card digits masked");
        }
    }
    if (dry_run)
        return DLQ_READER_OK;
    if (!(sent = calloc(n + 1, sizeof(*sent)))) {
        snprintf(err, err_size, "out of memory");
        goto out;
    }
    if (!(rk = kafka_setup_tool_producer(r->cfg, CLIENT_ID, err, err_size)))
        goto out;
    for (size_t i = 0; i < n; i++) {
        const struct dlq_letter *l = letters[i];
        if (items[i].skipped)
            continue;
        rd_kafka_headers_t *h = replay_headers(r, l, actor);
        rd_kafka_resp_err_t e =
            h ? rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(l->orig_topic),
                                  RD_KAFKA_V_KEY(l->key, l->key_len),
                                  RD_KAFKA_V_VALUE((void *)l->value, l->value_len),
                                  RD_KAFKA_V_HEADERS(h),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                  RD_KAFKA_V_OPAQUE(&sent[i]), RD_KAFKA_V_END)
              : RD_KAFKA_RESP_ERR__FAIL;
        if (e) {
            if (h)
                rd_kafka_headers_destroy(h);
            sent[i].done = 1;
            sent[i].err = e;
        }
    }
    rc = DLQ_READER_OK;
    if (rd_kafka_flush(rk, REPLAY_TIMEOUT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        snprintf(err, err_size, "kafka did not acknowledge within %d s",
                 REPLAY_TIMEOUT_MS / 1000);
        rc = DLQ_READER_FAILED;
        /* No report may arrive after `sent` is gone: what is left is
         * purged (its reports served now); it may still have landed. */
        rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_destroy(rk);
    rk = NULL;
    for (size_t i = 0; i < n; i++) {
        struct dlq_replay_item *it = &items[i];
        if (it->skipped)
            continue;
        if (!sent[i].done || sent[i].err) {
            snprintf(it->error, sizeof(it->error), "%s",
                     sent[i].done && sent[i].err != RD_KAFKA_RESP_ERR__PURGE_QUEUE &&
                             sent[i].err != RD_KAFKA_RESP_ERR__PURGE_INFLIGHT
                         ? rd_kafka_err2str(sent[i].err)
                         : "not acknowledged");
            failed++;
        } else {
            it->sent = 1;
            it->to_partition = sent[i].partition;
            it->to_offset = sent[i].offset;
        }
    }
    if (failed && rc == DLQ_READER_OK) {
        snprintf(err, err_size, "%zu of %zu letters not sent", failed, n);
        rc = DLQ_READER_FAILED;
    }
out:
    if (rk)
        rd_kafka_destroy(rk);
    free(sent);
    return rc;
}
