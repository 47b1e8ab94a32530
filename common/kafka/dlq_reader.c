#include "dlq_reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <librdkafka/rdkafka.h>

#include "clock.h"
#include "decimal.h"
#include "dlq_reader_int.h"
#include "kafka_setup.h"

#define KAFKA_TIMEOUT_MS 10000
/* A read polls this long, then asks where the partitions stand: a
 * partition can end in offsets no consumer receives (transaction markers,
 * aborted letters), seen only as the position moving past them. */
#define POLL_SLICE_MS 100

/* One partition's offsets [from, to) to read; want (sorted, nwant of
 * them), when given, the only ones kept. */
struct span {
    int32_t partition;
    int64_t from, to;
    const int64_t *want;
    size_t nwant;
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

char *dlq_copy_bytes(const void *p, size_t n)
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
    if ((m->key && !(key = dlq_copy_bytes(m->key, m->key_len))) ||
        (m->payload && !(value = dlq_copy_bytes(m->payload, m->len)))) {
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

dlq_reader_t *dlq_reader_new(const config_t *cfg, struct charged_error *err)
{
    dlq_reader_t *r = calloc(1, sizeof(*r));
    rd_kafka_conf_t *conf = NULL;
    if (!r) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    r->cfg = cfg;
    r->topic = config_str(cfg, CONFIG_CHARGE_DLQ_TOPIC);
    if (!(conf = kafka_setup_conf(cfg, CLIENT_ID, err)))
        goto out;
    kafka_setup_apply_env(conf, cfg);
    /* A group id is required by the API; with assign() and no commits the
     * group never sees us. */
    if (kafka_setup_set(conf, "group.id", "chargectl-dlq-reader", err) ||
        kafka_setup_set(conf, "enable.auto.commit", "false", err) ||
        kafka_setup_set(conf, "enable.auto.offset.store", "false", err) ||
        /* Letters of a transaction not committed (or aborted) are not
         * letters; the end offset is then the last stable one. */
        kafka_setup_set(conf, "isolation.level", "read_committed", err) ||
        /* A read asks for what is there: the broker need not wait for more. */
        kafka_setup_set(conf, "fetch.wait.max.ms", "10", err) ||
        /* What is fetched ahead stays small: a console reads in many
         * requests at once. */
        kafka_setup_set(conf, "queued.max.messages.kbytes", "4096", err) ||
        kafka_setup_set(conf, "fetch.max.bytes", "4194304", err))
        goto out;
    char rderr[sizeof(err->message)];
    if (!(r->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, rderr, sizeof(rderr)))) {
        charged_error_set(err, "%s", rderr);
        goto out;
    }
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
static int dlq_partitions(dlq_reader_t *r, struct charged_error *err)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *t = rd_kafka_topic_new(r->consumer, r->topic, NULL);
    rd_kafka_resp_err_t e = rd_kafka_metadata(r->consumer, 0, t, &md, KAFKA_TIMEOUT_MS);
    int n = -1;
    if (e) {
        charged_error_set(err, "kafka unreachable at %s: %s",
                          config_str(r->cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS),
                          rd_kafka_err2str(e));
    } else if (md->topic_cnt < 1 || md->topics[0].err) {
        charged_error_set(err, "dead-letter topic '%s' does not exist", r->topic);
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

static enum charged_rc watermarks(dlq_reader_t *r, int32_t p, int64_t *lo, int64_t *hi,
                                  struct charged_error *err)
{
    rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(r->consumer, r->topic, p,
                                                             lo, hi, KAFKA_TIMEOUT_MS);
    if (e)
        charged_error_set(err, "cannot read offsets of %s [%d]: %s", r->topic, (int)p,
                          rd_kafka_err2str(e));
    return e ? CHARGED_RETRY : CHARGED_OK;
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

/* One read of spans under way: which span each partition is, which are
 * read, and where each stood when assigned. */
struct reading {
    dlq_reader_t *r;
    int np;
    const struct span *sp;
    size_t nsp, open; /* spans; those not read yet */
    int summary;
    int *idx;      /* partition -> its span, or -1 */
    char *done;    /* per span: read */
    int64_t *base; /* per span: its position as assigned */
    rd_kafka_topic_partition_list_t *list, *pos;
    int assigned;
    int64_t deadline; /* Kafka not answering by then is unreachable */
};

/* Span i is read: nothing more of its partition is wanted. */
static void span_done(struct reading *rd, size_t i)
{
    rd->done[i] = 1;
    rd->open--;
    unassign(rd->r, rd->sp[i].partition);
}

/* Assigns every span's partition at its first offset and notes where each
 * stands: CHARGED_OK, or why not (err). */
static enum charged_rc reading_assign(struct reading *rd, struct charged_error *err)
{
    dlq_reader_t *r = rd->r;
    for (int p = 0; p < rd->np; p++)
        rd->idx[p] = -1;
    for (size_t i = 0; i < rd->nsp; i++) {
        rd->idx[rd->sp[i].partition] = (int)i;
        rd_kafka_topic_partition_list_add(rd->list, r->topic, rd->sp[i].partition)
            ->offset = rd->sp[i].from;
        rd->open++;
    }
    if (rd->open == 0)
        return CHARGED_OK;
    rd_kafka_error_t *ae = rd_kafka_incremental_assign(r->consumer, rd->list);
    if (ae) {
        charged_error_set(err, "cannot read '%s': %s", r->topic,
                          rd_kafka_error_string(ae));
        rd_kafka_error_destroy(ae);
        return CHARGED_RETRY;
    }
    rd->assigned = 1;
    /* The position as assigned: one left from an earlier read of the
     * partition says nothing about this one. */
    rd_kafka_position(r->consumer, rd->list);
    for (size_t i = 0; i < rd->nsp; i++)
        rd->base[i] = rd->list->elems[i].err ? RD_KAFKA_OFFSET_INVALID
                                             : rd->list->elems[i].offset;
    return CHARGED_OK;
}

/* A message polled: kept when its span wants it. 0, or -1 when out of
 * memory. */
static int reading_take(struct reading *rd, const rd_kafka_message_t *m)
{
    int i = m->err || m->partition < 0 || m->partition >= rd->np
                ? -1
                : rd->idx[m->partition];
    /* A span counts as read once, whatever arrives after its end (letters
     * produced meanwhile, fetched before it was unassigned). */
    if (i < 0 || rd->done[i])
        return 0;
    rd->deadline = clock_now_ms() + KAFKA_TIMEOUT_MS;
    if (wanted(&rd->sp[i], m->offset) && keep(rd->r, m, rd->summary) != 0)
        return -1;
    if (m->offset + 1 >= rd->sp[i].to)
        span_done(rd, (size_t)i);
    return 0;
}

/* Nothing came: a span whose position is past its last letter ended in
 * offsets that are not letters. 0, or -1 when out of memory. */
static int reading_positions(struct reading *rd)
{
    if (rd->pos)
        rd_kafka_topic_partition_list_destroy(rd->pos);
    if (!(rd->pos = rd_kafka_topic_partition_list_new((int)rd->open)))
        return -1;
    for (size_t i = 0; i < rd->nsp; i++)
        if (!rd->done[i])
            rd_kafka_topic_partition_list_add(rd->pos, rd->r->topic,
                                              rd->sp[i].partition);
    rd_kafka_position(rd->r->consumer, rd->pos);
    for (int k = 0; k < rd->pos->cnt; k++) {
        const rd_kafka_topic_partition_t *e = &rd->pos->elems[k];
        int i = rd->idx[e->partition];
        if (e->err || e->offset < rd->sp[i].to || e->offset == rd->base[i])
            continue;
        span_done(rd, (size_t)i);
        rd->deadline = clock_now_ms() + KAFKA_TIMEOUT_MS;
    }
    return 0;
}

/* Polls until every span is read: CHARGED_OK, or why not (err). */
static enum charged_rc reading_poll(struct reading *rd, struct charged_error *err)
{
    rd->deadline = clock_now_ms() + KAFKA_TIMEOUT_MS;
    while (rd->open > 0) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rd->r->consumer, POLL_SLICE_MS);
        if (m) {
            int bad = reading_take(rd, m);
            rd_kafka_message_destroy(m);
            if (bad) {
                charged_error_set(err, "out of memory");
                return CHARGED_RETRY;
            }
            continue;
        }
        if (reading_positions(rd) != 0) {
            charged_error_set(err, "out of memory");
            return CHARGED_RETRY;
        }
        if (rd->open > 0 && clock_now_ms() >= rd->deadline) {
            charged_error_set(err, "kafka stopped answering while reading '%s'",
                              rd->r->topic);
            return CHARGED_RETRY;
        }
    }
    return CHARGED_OK;
}

/* Reads the spans (one per partition at most, each from < to, partitions
 * below np), keeping what they want. A span is read once a letter at or
 * past its end arrives or the consumer's position reaches its end (the
 * offsets before can be markers no one receives); ten seconds without
 * either is Kafka not answering. */
static enum charged_rc read_spans(dlq_reader_t *r, int np, const struct span *sp,
                                  size_t nsp, int summary, struct charged_error *err)
{
    struct reading rd = {
        .r = r,
        .np = np,
        .sp = sp,
        .nsp = nsp,
        .summary = summary,
        .idx = malloc(((size_t)np + 1) * sizeof(*rd.idx)),
        .done = calloc(nsp + 1, 1),
        .base = calloc(nsp + 1, sizeof(*rd.base)),
        .list = rd_kafka_topic_partition_list_new((int)nsp),
    };
    enum charged_rc rc;
    if (!rd.list || !rd.idx || !rd.done || !rd.base) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
    } else if ((rc = reading_assign(&rd, err)) == CHARGED_OK)
        rc = reading_poll(&rd, err);
    /* Nothing stays assigned: the next read starts from its own offsets. */
    for (size_t i = 0; rd.assigned && i < nsp; i++)
        if (!rd.done[i])
            unassign(r, sp[i].partition);
    if (rd.pos)
        rd_kafka_topic_partition_list_destroy(rd.pos);
    free(rd.base);
    free(rd.done);
    free(rd.idx);
    if (rd.list)
        rd_kafka_topic_partition_list_destroy(rd.list);
    return rc;
}

/* Reads the newest max offsets of every partition (max < 0: all of them),
 * counting every offset there is in r->total. */
static enum charged_rc read_newest(dlq_reader_t *r, int64_t max, int summary,
                                   struct charged_error *err)
{
    int np = dlq_partitions(r, err);
    if (np < 0)
        return CHARGED_RETRY;
    struct span *sp = calloc((size_t)np + 1, sizeof(*sp));
    size_t nsp = 0;
    int64_t total = 0;
    enum charged_rc rc = CHARGED_RETRY;
    if (!sp) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    for (int p = 0; p < np; p++) {
        int64_t lo, hi;
        if (watermarks(r, p, &lo, &hi, err) != 0)
            goto out;
        total += hi - lo;
        if (max >= 0 && hi - lo > max)
            lo = hi - max;
        if (hi > lo)
            sp[nsp++] = (struct span){.partition = p, .from = lo, .to = hi};
    }
    rc = read_spans(r, np, sp, nsp, summary, err);
    if (rc == CHARGED_OK)
        r->total = total;
out:
    free(sp);
    return rc;
}

enum charged_rc dlq_reader_read_all(dlq_reader_t *r, struct charged_error *err)
{
    return read_newest(r, -1, 0, err);
}

enum charged_rc dlq_reader_read_newest(dlq_reader_t *r, int64_t max_per_partition,
                                       struct charged_error *err)
{
    return read_newest(r, max_per_partition < 0 ? 0 : max_per_partition, 1, err);
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

/* The positions asked for, sorted by partition and offset (w, and their
 * offsets alone in offs), with what each partition holds (lo..hi) and,
 * per partition, its next run of offsets to read (at) and its last (end). */
struct positions {
    int np;
    struct want *w;
    int64_t *offs, *lo, *hi;
    struct span *sp;
    size_t *at, *end;
    size_t nw;
};

static void positions_free(struct positions *ps)
{
    free(ps->end);
    free(ps->at);
    free(ps->sp);
    free(ps->hi);
    free(ps->lo);
    free(ps->offs);
    free(ps->w);
}

/* The per-partition arrays, once the partitions are known: 0, or -1 when
 * out of memory. */
static int positions_alloc(struct positions *ps)
{
    size_t np = (size_t)ps->np + 1;
    ps->lo = calloc(np, sizeof(*ps->lo));
    ps->hi = calloc(np, sizeof(*ps->hi));
    ps->sp = calloc(np, sizeof(*ps->sp));
    ps->at = calloc(np, sizeof(*ps->at));
    ps->end = calloc(np, sizeof(*ps->end));
    if (!ps->lo || !ps->hi || !ps->sp || !ps->at || !ps->end)
        return -1;
    for (int p = 0; p < ps->np; p++)
        ps->lo[p] = ps->hi[p] = -1;
    return 0;
}

/* Checks every position against its partition before any is read, and
 * sorts them: CHARGED_OK, or why not (err). */
static enum charged_rc positions_check(dlq_reader_t *r, struct positions *ps,
                                       const int32_t *partitions,
                                       const int64_t *offsets, size_t n,
                                       struct charged_error *err)
{
    for (size_t i = 0; i < n; i++) {
        int32_t p = partitions[i];
        if (p >= ps->np) {
            charged_error_set(err, "no partition %d in '%s' (it has %d)", (int)p,
                              r->topic, ps->np);
            return CHARGED_NOT_FOUND;
        }
        if (ps->hi[p] < 0 && watermarks(r, p, &ps->lo[p], &ps->hi[p], err) != 0)
            return CHARGED_RETRY;
        if (offsets[i] < ps->lo[p] || offsets[i] >= ps->hi[p]) {
            charged_error_set(
                err, "no dead letter at %d:%lld (partition holds %lld..%lld)", (int)p,
                (long long)offsets[i], (long long)ps->lo[p], (long long)ps->hi[p] - 1);
            return CHARGED_NOT_FOUND;
        }
        ps->w[ps->nw++] = (struct want){p, offsets[i]};
    }
    qsort(ps->w, ps->nw, sizeof(*ps->w), cmp_want);
    for (size_t i = 0; i < ps->nw; i++) {
        ps->offs[i] = ps->w[i].offset;
        if (i == 0 || ps->w[i].partition != ps->w[i - 1].partition)
            ps->at[ps->w[i].partition] = i;
        ps->end[ps->w[i].partition] = i + 1;
    }
    return CHARGED_OK;
}

/* Rounds: each reads the next run of close offsets of every partition at
 * once, so that 500 neighbouring positions cost one read. */
static enum charged_rc positions_read(dlq_reader_t *r, struct positions *ps,
                                      struct charged_error *err)
{
    for (;;) {
        size_t nsp = 0;
        for (int p = 0; p < ps->np; p++) {
            size_t a = ps->at[p], b = a;
            if (a >= ps->end[p])
                continue;
            while (b + 1 < ps->end[p] && ps->offs[b + 1] - ps->offs[b] <= SPAN_GAP)
                b++;
            ps->sp[nsp++] = (struct span){.partition = p,
                                          .from = ps->offs[a],
                                          .to = ps->offs[b] + 1,
                                          .want = ps->offs + a,
                                          .nwant = b + 1 - a};
            ps->at[p] = b + 1;
        }
        if (nsp == 0)
            return CHARGED_OK;
        enum charged_rc rc = read_spans(r, ps->np, ps->sp, nsp, 0, err);
        if (rc != CHARGED_OK)
            return rc;
    }
}

/* The letters read since slot `before`, one a position: a position inside
 * its partition can still hold no letter (a transaction marker, an
 * aborted letter). */
static enum charged_rc positions_found(const dlq_reader_t *r, size_t before,
                                       const int32_t *partitions,
                                       const int64_t *offsets, size_t n,
                                       const struct dlq_letter **letters,
                                       struct charged_error *err)
{
    for (size_t i = 0; i < n; i++) {
        const struct dlq_letter *l = found(r, before, partitions[i], offsets[i]);
        if (!l) {
            charged_error_set(err, "no dead letter at %d:%lld", (int)partitions[i],
                              (long long)offsets[i]);
            return CHARGED_NOT_FOUND;
        }
        if (letters)
            letters[i] = l;
    }
    return CHARGED_OK;
}

enum charged_rc dlq_reader_read_positions(dlq_reader_t *r, const int32_t *partitions,
                                          const int64_t *offsets, size_t n,
                                          const struct dlq_letter **letters,
                                          struct charged_error *err)
{
    struct positions ps = {.w = calloc(n + 1, sizeof(*ps.w)),
                           .offs = calloc(n + 1, sizeof(*ps.offs))};
    size_t before = r->n;
    enum charged_rc rc = CHARGED_RETRY;
    if (!ps.w || !ps.offs) {
        charged_error_set(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (partitions[i] < 0 || offsets[i] < 0) {
            charged_error_set(err, "no dead letter at %d:%lld", (int)partitions[i],
                              (long long)offsets[i]);
            rc = CHARGED_NOT_FOUND;
            goto out;
        }
    }
    if (n == 0) {
        rc = CHARGED_OK;
        goto out;
    }
    rc = CHARGED_RETRY;
    if ((ps.np = dlq_partitions(r, err)) < 0)
        goto out;
    if (positions_alloc(&ps) != 0) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
        goto out;
    }
    if ((rc = positions_check(r, &ps, partitions, offsets, n, err)) == CHARGED_OK &&
        (rc = positions_read(r, &ps, err)) == CHARGED_OK)
        rc = positions_found(r, before, partitions, offsets, n, letters, err);
out:
    positions_free(&ps);
    return rc;
}

enum charged_rc dlq_reader_read_one(dlq_reader_t *r, int32_t partition, int64_t offset,
                                    struct charged_error *err)
{
    return dlq_reader_read_positions(r, &partition, &offset, 1, NULL, err);
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
