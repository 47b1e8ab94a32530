/* chargectl dlq: list, show and replay dead letters.
 *
 * Reading assigns partitions directly (no group membership) with automatic
 * commits off: it never commits an offset of any group and never removes
 * anything. Replay sends a letter back to its original topic with its key,
 * value and original headers plus dlq.replayed_from; the worker then treats
 * it like any other command, so replaying twice cannot charge twice. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "charge_command.h"
#include "clock.h"
#include "chargectl.h"
#include "config.h"
#include "ctl_output.h"
#include "dead_letter.h"
#include "kafka_setup.h"
#include "log.h"

#define KAFKA_TIMEOUT_MS 10000

/* One dead letter, as read. */
struct letter {
    int32_t partition;
    int64_t offset;
    int64_t timestamp_ms;
    char *key, *value; /* NULL when absent */
    size_t key_len, value_len;
    rd_kafka_headers_t *headers;
    const char *reason, *error, *failed_at, *orig_topic, *orig_partition, *orig_offset;
    char attempt[64], order[64];
    int64_t failed_at_ms;
};

struct filters {
    const char *reason, *attempt, *order;
    int64_t since_ms, until_ms;
    int64_t limit;
    int have_since, have_until;
    const char *given; /* the first filter (or limit) option given, by name */
};

struct dlq_ctx {
    config_t *cfg;
    rd_kafka_t *consumer;
    const char *topic;
    struct letter *letters;
    size_t n, cap;
};

static void letter_release(struct letter *l)
{
    free(l->key);
    free(l->value);
    if (l->headers)
        rd_kafka_headers_destroy(l->headers);
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

static void take_ids(struct letter *l)
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

static int keep(struct dlq_ctx *c, const rd_kafka_message_t *m)
{
    rd_kafka_headers_t *h = NULL;
    if (c->n == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 64;
        struct letter *nl = realloc(c->letters, ncap * sizeof(*nl));
        if (!nl)
            return -1;
        c->letters = nl;
        c->cap = ncap;
    }
    struct letter *l = &c->letters[c->n];
    memset(l, 0, sizeof(*l));
    l->partition = m->partition;
    l->offset = m->offset;
    l->timestamp_ms = rd_kafka_message_timestamp(m, NULL);
    if (m->key && !(l->key = copy_bytes(m->key, m->key_len)))
        return -1;
    l->key_len = m->key_len;
    if (m->payload && !(l->value = copy_bytes(m->payload, m->len)))
        return -1;
    l->value_len = m->len;
    if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR)
        l->headers = rd_kafka_headers_copy(h);
    l->reason = header(l->headers, "dlq.reason");
    l->error = header(l->headers, "dlq.error");
    l->failed_at = header(l->headers, "dlq.failed_at");
    l->orig_topic = header(l->headers, "dlq.original.topic");
    l->orig_partition = header(l->headers, "dlq.original.partition");
    l->orig_offset = header(l->headers, "dlq.original.offset");
    if (!l->failed_at || clock_parse_rfc3339(l->failed_at, &l->failed_at_ms) != 0)
        l->failed_at_ms = l->timestamp_ms;
    take_ids(l);
    c->n++;
    return 0;
}

static int open_reader(struct dlq_ctx *c, char *err, size_t err_size)
{
    rd_kafka_conf_t *conf = kafka_setup_conf(c->cfg, "chargectl", err, err_size);
    if (!conf)
        return CTL_USAGE;
    kafka_setup_apply_env(conf, c->cfg);
    /* A group id is required by the API; with assign() and no commits the
     * group never sees us. */
    if (kafka_setup_set(conf, "group.id", "chargectl-dlq-reader", err, err_size) ||
        kafka_setup_set(conf, "enable.auto.commit", "false", err, err_size) ||
        kafka_setup_set(conf, "enable.auto.offset.store", "false", err, err_size)) {
        rd_kafka_conf_destroy(conf);
        return CTL_USAGE;
    }
    c->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, err_size);
    if (!c->consumer) {
        rd_kafka_conf_destroy(conf);
        return CTL_USAGE;
    }
    return CTL_OK;
}

/* Partition count of the DLQ topic, or -1 when Kafka does not answer. */
static int dlq_partitions(struct dlq_ctx *c, char *err, size_t err_size)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *t = rd_kafka_topic_new(c->consumer, c->topic, NULL);
    rd_kafka_resp_err_t e = rd_kafka_metadata(c->consumer, 0, t, &md, KAFKA_TIMEOUT_MS);
    int n = -1;
    if (e) {
        snprintf(err, err_size, "kafka unreachable at %s: %s",
                 config_str(c->cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS),
                 rd_kafka_err2str(e));
    } else if (md->topic_cnt < 1 || md->topics[0].err) {
        snprintf(err, err_size, "dead-letter topic '%s' does not exist", c->topic);
    } else {
        n = md->topics[0].partition_cnt;
    }
    if (md)
        rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(t);
    return n;
}

/* Reads [from, to) of the given partitions (to = -1: the current end). */
static int read_range(struct dlq_ctx *c, int32_t only_partition, int64_t only_offset,
                      char *err, size_t err_size)
{
    int np = dlq_partitions(c, err, err_size);
    if (np < 0)
        return CTL_FAILED;
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(np);
    int64_t *end = calloc((size_t)np, sizeof(*end));
    int open = 0, rc = CTL_FAILED;
    if (!list || !end) {
        snprintf(err, err_size, "out of memory");
        rd_kafka_topic_partition_list_destroy(list);
        free(end);
        return CTL_FAILED;
    }
    for (int p = 0; p < np; p++) {
        int64_t lo, hi;
        if (only_partition >= 0 && p != only_partition)
            continue;
        rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(
            c->consumer, c->topic, p, &lo, &hi, KAFKA_TIMEOUT_MS);
        if (e) {
            snprintf(err, err_size, "cannot read offsets of %s [%d]: %s", c->topic, p,
                     rd_kafka_err2str(e));
            goto out;
        }
        if (only_offset >= 0) {
            if (only_offset < lo || only_offset >= hi) {
                snprintf(err, err_size,
                         "no dead letter at %d:%lld (partition holds %lld..%lld)", p,
                         (long long)only_offset, (long long)lo, (long long)hi - 1);
                goto out;
            }
            lo = only_offset;
            hi = only_offset + 1;
        }
        end[p] = hi;
        if (hi > lo) {
            rd_kafka_topic_partition_list_add(list, c->topic, p)->offset = lo;
            open++;
        }
    }
    if (only_partition >= np) {
        snprintf(err, err_size, "no partition %d in '%s' (it has %d)",
                 (int)only_partition, c->topic, np);
        goto out;
    }
    rd_kafka_incremental_assign(c->consumer, list);
    while (open > 0) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c->consumer, KAFKA_TIMEOUT_MS);
        if (!m) {
            snprintf(err, err_size, "kafka stopped answering while reading '%s'",
                     c->topic);
            goto out;
        }
        if (m->err) {
            rd_kafka_message_destroy(m);
            continue;
        }
        if (m->offset < end[m->partition] && keep(c, m) != 0) {
            rd_kafka_message_destroy(m);
            snprintf(err, err_size, "out of memory");
            goto out;
        }
        if (m->offset + 1 >= end[m->partition]) {
            open--;
            rd_kafka_topic_partition_list_t *one = rd_kafka_topic_partition_list_new(1);
            rd_kafka_topic_partition_list_add(one, c->topic, m->partition);
            rd_kafka_incremental_unassign(c->consumer, one);
            rd_kafka_topic_partition_list_destroy(one);
        }
        rd_kafka_message_destroy(m);
    }
    rc = CTL_OK;
out:
    free(end);
    rd_kafka_topic_partition_list_destroy(list);
    return rc;
}

static int matches(const struct letter *l, const struct filters *f)
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
    const struct letter *x = *(const struct letter *const *)a,
                        *y = *(const struct letter *const *)b;
    if (x->failed_at_ms != y->failed_at_ms)
        return x->failed_at_ms < y->failed_at_ms ? -1 : 1;
    if (x->partition != y->partition)
        return x->partition < y->partition ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The letters that pass the filters, oldest first, the newest `limit`. */
static struct letter **select_letters(struct dlq_ctx *c, const struct filters *f,
                                      size_t *count)
{
    struct letter **sel = calloc(c->n + 1, sizeof(*sel));
    size_t n = 0;
    if (!sel)
        return NULL;
    for (size_t i = 0; i < c->n; i++)
        if (matches(&c->letters[i], f))
            sel[n++] = &c->letters[i];
    qsort(sel, n, sizeof(*sel), cmp_time);
    if (f->limit > 0 && n > (size_t)f->limit) {
        memmove(sel, sel + (n - (size_t)f->limit), (size_t)f->limit * sizeof(*sel));
        n = (size_t)f->limit;
    }
    *count = n;
    return sel;
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

static json_t *headers_json(rd_kafka_headers_t *h)
{
    json_t *arr = json_array();
    const char *name;
    const void *val;
    size_t sz;
    for (size_t i = 0; h && !rd_kafka_header_get_all(h, i, &name, &val, &sz); i++)
        json_array_append_new(arr, json_pack("[s, o]", name, bytes_json(val, sz, 0)));
    return arr;
}

static json_t *letter_summary_json(const struct letter *l)
{
    char pos[48];
    snprintf(pos, sizeof(pos), "%d:%lld", (int)l->partition, (long long)l->offset);
    return json_pack(
        "{s:s, s:i, s:I, s:s?, s:s?, s:s?, s:s?, s:s?, s:{s:s?, s:s?, s:s?}}",
        "position", pos, "partition", (int)l->partition, "offset",
        (json_int_t)l->offset, "failed_at", l->failed_at, "reason", l->reason,
        "payment_attempt_id", l->attempt[0] ? l->attempt : NULL, "order_id",
        l->order[0] ? l->order : NULL, "error", l->error, "original", "topic",
        l->orig_topic, "partition", l->orig_partition, "offset", l->orig_offset);
}

/* Prints bytes for people: text as is, anything else as \xNN. */
static void print_escaped(FILE *out, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\\')
            fputs("\\\\", out);
        else if (ch >= 0x20 && ch < 0x7f)
            fputc(ch, out);
        else if (ch == '\n')
            fputs("\\n", out);
        else
            fprintf(out, "\\x%02x", ch);
    }
}

/* ---- options ---- */

enum {
    OPT_REASON = 1000,
    OPT_SINCE,
    OPT_UNTIL,
    OPT_ATTEMPT,
    OPT_ORDER,
    OPT_LIMIT,
    OPT_JSON,
    OPT_DRY_RUN,
    OPT_HELP
};

static const struct option dlq_opts[] = {
    {"reason", required_argument, NULL, OPT_REASON},
    {"since", required_argument, NULL, OPT_SINCE},
    {"until", required_argument, NULL, OPT_UNTIL},
    {"attempt", required_argument, NULL, OPT_ATTEMPT},
    {"order", required_argument, NULL, OPT_ORDER},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"json", no_argument, NULL, OPT_JSON},
    {"dry-run", no_argument, NULL, OPT_DRY_RUN},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl dlq list [filters] [--json]\n"
        "       chargectl dlq show PARTITION:OFFSET [--json]\n"
        "       chargectl dlq replay (PARTITION:OFFSET... | filters) [--dry-run] "
        "[--json]\n\n"
        "Reads CHARGE_DLQ_TOPIC without committing any offset and without removing\n"
        "anything.\n\n"
        "  list     one line per dead letter: position, time, reason code, attempt\n"
        "           and order ids, first error line; the newest --limit, oldest first\n"
        "  show     the whole dead letter: headers, key, value (pretty JSON when it "
        "is\n"
        "           JSON, bytes escaped as \\xNN when not)\n"
        "  replay   sends dead letters back to their original topic with their key,\n"
        "           value and original headers plus dlq.replayed_from; the worker\n"
        "           treats them as any command, so a replay never charges twice.\n"
        "           card_data_refused letters are refused: their digits are masked.\n\n"
        "Filters:\n"
        "  --reason CODE      a reason code (docs/dead-letters.md)\n"
        "  --since TIME       failed at or after TIME: RFC 3339 UTC or a duration ago\n"
        "                     (30s, 15m, 2h, 7d)\n"
        "  --until TIME       failed before TIME\n"
        "  --attempt UUID     payment_attempt_id\n"
        "  --order UUID       order_id\n"
        "  --limit N          at most N letters, the newest [list: 100; replay: all]\n"
        "Other:\n"
        "  --json             JSON instead of a table\n"
        "  --dry-run          replay: show what would be sent, send nothing\n"
        "  --help             this text\n\n"
        "Exit status: 0 done, 1 Kafka unreachable or no such letter, 2 bad usage.\n");
}

/* Parses options; positional arguments are left in argv[optind..]. */
static int parse_opts(int argc, char **argv, struct filters *f, int *as_json,
                      int *dry_run)
{
    int c;
    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    int li = -1;
    while ((c = getopt_long(argc, argv, "", dlq_opts, &li)) != -1) {
        if (!f->given && c >= OPT_REASON && c <= OPT_LIMIT && li >= 0)
            f->given = dlq_opts[li].name;
        switch (c) {
        case OPT_REASON:
            if (dead_letter_reason_parse(optarg) < 0) {
                fprintf(stderr, "chargectl dlq: unknown reason '%s'\n", optarg);
                return CTL_USAGE;
            }
            f->reason = optarg;
            break;
        case OPT_SINCE:
        case OPT_UNTIL: {
            int64_t t;
            if (ctl_parse_time_ms(optarg, &t) != 0) {
                fprintf(stderr,
                        "chargectl dlq: %s '%s' is not an RFC 3339 UTC time or a "
                        "duration (30s, 15m, 2h, 7d)\n",
                        c == OPT_SINCE ? "--since" : "--until", optarg);
                return CTL_USAGE;
            }
            if (c == OPT_SINCE)
                f->since_ms = t, f->have_since = 1;
            else
                f->until_ms = t, f->have_until = 1;
            break;
        }
        case OPT_ATTEMPT:
        case OPT_ORDER:
            /* A typo would match nothing and look like "no letters". */
            if (!charge_command_is_uuid(optarg)) {
                fprintf(stderr, "chargectl dlq: %s '%s' is not a UUID\n",
                        c == OPT_ATTEMPT ? "--attempt" : "--order", optarg);
                return CTL_USAGE;
            }
            if (c == OPT_ATTEMPT)
                f->attempt = optarg;
            else
                f->order = optarg;
            break;
        case OPT_LIMIT:
            if (ctl_parse_number(optarg, INT64_MAX, &f->limit, NULL) != 0 ||
                f->limit < 1) {
                fprintf(stderr,
                        "chargectl dlq: --limit '%s' is not a whole number from 1 up\n",
                        optarg);
                return CTL_USAGE;
            }
            break;
        case OPT_JSON:
            *as_json = 1;
            break;
        case OPT_DRY_RUN:
            *dry_run = 1;
            break;
        case OPT_HELP:
            usage(stdout);
            return -1;
        default:
            return ctl_bad_option("dlq", argv[optind - 1]);
        }
    }
    return CTL_OK;
}

/* "PARTITION:OFFSET", digits only, each within its type: anything else is
 * refused rather than clamped into a position that names another letter. */
static int parse_position(const char *s, int32_t *p, int64_t *o)
{
    const char *rest;
    int64_t part;
    if (ctl_parse_number(s, INT32_MAX, &part, &rest) != 0 || *rest != ':' ||
        ctl_parse_number(rest + 1, INT64_MAX, o, NULL) != 0)
        return -1;
    *p = (int32_t)part;
    return 0;
}

/* Checks every position before anything is read: exit 2, one line. */
static int check_positions(const char *sub, int n, char **args)
{
    int32_t p;
    int64_t o;
    for (int i = 0; i < n; i++) {
        if (parse_position(args[i], &p, &o) != 0) {
            fprintf(stderr,
                    "chargectl dlq %s: '%s' is not PARTITION:OFFSET (partition "
                    "0..%d, offset 0..%lld)\n",
                    sub, args[i], INT32_MAX, (long long)INT64_MAX);
            return CTL_USAGE;
        }
    }
    return CTL_OK;
}

/* ---- subcommands ---- */

static int dlq_list(struct dlq_ctx *c, const struct filters *f, int as_json)
{
    char err[512];
    size_t n;
    int rc = read_range(c, -1, -1, err, sizeof(err));
    if (rc != CTL_OK) {
        fprintf(stderr, "chargectl dlq list: %s\n", err);
        return rc;
    }
    struct filters lf = *f;
    if (lf.limit == 0)
        lf.limit = 100;
    struct letter **sel = select_letters(c, &lf, &n);
    if (as_json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, letter_summary_json(sel[i]));
        ctl_print_json(stdout, arr);
    } else {
        const char *hdr[] = {"POSITION", "FAILED_AT", "REASON", "ATTEMPT",
                             "ORDER",    "ERROR",     NULL};
        ctl_table_t *t = ctl_table_new(hdr);
        for (size_t i = 0; i < n; i++) {
            char pos[48];
            snprintf(pos, sizeof(pos), "%d:%lld", (int)sel[i]->partition,
                     (long long)sel[i]->offset);
            const char *row[] = {
                pos,           sel[i]->failed_at, sel[i]->reason, sel[i]->attempt,
                sel[i]->order, sel[i]->error};
            ctl_table_add(t, row);
        }
        ctl_table_print(t, stdout);
        ctl_table_free(t);
    }
    free(sel);
    return CTL_OK;
}

static int dlq_show(struct dlq_ctx *c, const char *position, int as_json)
{
    char err[512];
    int32_t p;
    int64_t o;
    if (parse_position(position, &p, &o) != 0) {
        fprintf(stderr, "chargectl dlq show: '%s' is not PARTITION:OFFSET\n", position);
        return CTL_USAGE;
    }
    int rc = read_range(c, p, o, err, sizeof(err));
    if (rc != CTL_OK || c->n == 0) {
        fprintf(stderr, "chargectl dlq show: %s\n", rc != CTL_OK ? err : "not found");
        return CTL_FAILED;
    }
    struct letter *l = &c->letters[0];
    if (as_json) {
        json_t *j = letter_summary_json(l);
        json_object_set_new(j, "timestamp_ms", json_integer(l->timestamp_ms));
        json_object_set_new(j, "headers", headers_json(l->headers));
        json_object_set_new(j, "key", bytes_json(l->key, l->key_len, 0));
        json_object_set_new(j, "value", bytes_json(l->value, l->value_len, 1));
        ctl_print_json(stdout, j);
        return CTL_OK;
    }
    printf("position:  %s:%d:%lld\n", c->topic, (int)l->partition,
           (long long)l->offset);
    printf("headers:\n");
    const char *name;
    const void *val;
    size_t sz;
    for (size_t i = 0;
         l->headers && !rd_kafka_header_get_all(l->headers, i, &name, &val, &sz); i++) {
        printf("  %s: ", name);
        if (val)
            print_escaped(stdout, val, sz);
        else
            printf("(null)");
        putchar('\n');
    }
    printf("key:       ");
    if (l->key)
        print_escaped(stdout, l->key, l->key_len);
    else
        printf("(null)");
    printf("\nvalue:\n");
    json_t *doc = l->value ? json_loadb(l->value, l->value_len, 0, NULL) : NULL;
    if (doc) {
        char *s = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", s ? s : "");
        free(s);
        json_decref(doc);
    } else if (l->value) {
        print_escaped(stdout, l->value, l->value_len);
        printf("\n(%zu bytes, not JSON)\n", l->value_len);
    } else {
        printf("(null)\n");
    }
    return CTL_OK;
}

static int dlq_replay(struct dlq_ctx *c, int argc, char **argv, const struct filters *f,
                      int as_json, int dry_run)
{
    char err[512];
    struct letter **sel = NULL;
    size_t n = 0;
    int rc;
    int explicit = optind < argc;

    if (explicit && f->given) {
        fprintf(stderr,
                "chargectl dlq replay: give positions or filters, not both (--%s)\n",
                f->given);
        return CTL_USAGE;
    }
    if (!explicit &&
        !(f->reason || f->attempt || f->order || f->have_since || f->have_until)) {
        fprintf(stderr,
                "chargectl dlq replay: name the letters: PARTITION:OFFSET... or "
                "at least one filter\n");
        return CTL_USAGE;
    }
    if (explicit) {
        for (int i = optind; i < argc; i++) {
            int32_t p;
            int64_t o;
            if (parse_position(argv[i], &p, &o) != 0) {
                fprintf(stderr, "chargectl dlq replay: '%s' is not PARTITION:OFFSET\n",
                        argv[i]);
                return CTL_USAGE;
            }
            rc = read_range(c, p, o, err, sizeof(err));
            if (rc != CTL_OK) {
                fprintf(stderr, "chargectl dlq replay: %s\n", err);
                return CTL_FAILED;
            }
        }
        sel = calloc(c->n + 1, sizeof(*sel));
        if (!sel) {
            fprintf(stderr, "chargectl dlq replay: out of memory\n");
            return CTL_FAILED;
        }
        for (size_t i = 0; i < c->n; i++)
            sel[n++] = &c->letters[i];
    } else {
        rc = read_range(c, -1, -1, err, sizeof(err));
        if (rc != CTL_OK) {
            fprintf(stderr, "chargectl dlq replay: %s\n", err);
            return rc;
        }
        sel = select_letters(c, f, &n);
    }
    /* Refuse what cannot be replayed before sending anything. */
    for (size_t i = 0; i < n; i++) {
        if (sel[i]->reason && !strcmp(sel[i]->reason, "card_data_refused") &&
            explicit) {
            fprintf(
                stderr,
                "chargectl dlq replay: %d:%lld is card_data_refused: its card digits "
                "are masked, so it cannot be replayed; the sender must send a clean "
                "command\n",
                (int)sel[i]->partition, (long long)sel[i]->offset);
            free(sel);
            return CTL_FAILED;
        }
        if (!sel[i]->orig_topic) {
            fprintf(stderr, "chargectl dlq replay: %d:%lld has no dlq.original.topic\n",
                    (int)sel[i]->partition, (long long)sel[i]->offset);
            free(sel);
            return CTL_FAILED;
        }
    }
    rd_kafka_t *rk = NULL;
    struct kafka_setup_delivery *sent = calloc(n + 1, sizeof(*sent));
    if (!sent) {
        fprintf(stderr, "chargectl dlq replay: out of memory\n");
        free(sel);
        return CTL_FAILED;
    }
    if (!dry_run) {
        rk = kafka_setup_tool_producer(c->cfg, "chargectl", err, sizeof(err));
        if (!rk) {
            fprintf(stderr, "chargectl dlq replay: %s\n", err);
            free(sel);
            free(sent);
            return CTL_FAILED;
        }
    }
    json_t *out = json_array();
    const char *hdr[] = {"POSITION", "REASON", "ATTEMPT", "TO", "RESULT", NULL};
    ctl_table_t *t = ctl_table_new(hdr);
    rc = CTL_OK;
    for (size_t i = 0; i < n; i++) {
        struct letter *l = sel[i];
        char from[320], pos[48];
        snprintf(from, sizeof(from), "%s:%d:%lld", c->topic, (int)l->partition,
                 (long long)l->offset);
        snprintf(pos, sizeof(pos), "%d:%lld", (int)l->partition, (long long)l->offset);
        if (l->reason && !strcmp(l->reason, "card_data_refused")) {
            const char *row[] = {pos, l->reason, l->attempt, l->orig_topic,
                                 "skipped: card digits masked"};
            ctl_table_add(t, row);
            json_array_append_new(out,
                                  json_pack("{s:s, s:s, s:b}", "position", pos,
                                            "skipped", "card_data_refused", "sent", 0));
            continue;
        }
        if (dry_run) {
            const char *row[] = {pos, l->reason, l->attempt, l->orig_topic,
                                 "would send"};
            ctl_table_add(t, row);
            json_t *j = letter_summary_json(l);
            json_object_set_new(j, "sent", json_false());
            json_object_set_new(j, "replayed_from", json_string(from));
            json_array_append_new(out, j);
            continue;
        }
        /* The original headers (without the dlq.* ones we added) plus where
         * this replay comes from. */
        rd_kafka_headers_t *h = rd_kafka_headers_new(8);
        const char *name;
        const void *val;
        size_t sz;
        for (size_t k = 0;
             l->headers && !rd_kafka_header_get_all(l->headers, k, &name, &val, &sz);
             k++)
            if (strncmp(name, "dlq.", 4) != 0)
                rd_kafka_header_add(h, name, -1, val, val ? (ssize_t)sz : 0);
        rd_kafka_header_add(h, "dlq.replayed_from", -1, from, -1);
        rd_kafka_resp_err_t e = rd_kafka_producev(
            rk, RD_KAFKA_V_TOPIC(l->orig_topic), RD_KAFKA_V_KEY(l->key, l->key_len),
            RD_KAFKA_V_VALUE(l->value, l->value_len), RD_KAFKA_V_HEADERS(h),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(&sent[i]),
            RD_KAFKA_V_END);
        if (e) {
            rd_kafka_headers_destroy(h);
            sent[i].done = 1;
            sent[i].err = e;
        }
    }
    if (rk && rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr,
                "chargectl dlq replay: kafka did not acknowledge within 30 s\n");
        rc = CTL_FAILED;
    }
    for (size_t i = 0; !dry_run && i < n; i++) {
        struct letter *l = sel[i];
        char pos[48], result[128];
        if (l->reason && !strcmp(l->reason, "card_data_refused"))
            continue;
        snprintf(pos, sizeof(pos), "%d:%lld", (int)l->partition, (long long)l->offset);
        if (!sent[i].done || sent[i].err) {
            snprintf(result, sizeof(result), "failed: %s",
                     sent[i].done ? rd_kafka_err2str(sent[i].err) : "not acknowledged");
            rc = CTL_FAILED;
        } else {
            snprintf(result, sizeof(result), "sent to [%d] at offset %lld",
                     (int)sent[i].partition, (long long)sent[i].offset);
        }
        const char *row[] = {pos, l->reason, l->attempt, l->orig_topic, result};
        ctl_table_add(t, row);
        json_t *j = letter_summary_json(l);
        json_object_set_new(j, "sent", json_boolean(sent[i].done && !sent[i].err));
        if (sent[i].done && !sent[i].err) {
            json_object_set_new(j, "sent_partition", json_integer(sent[i].partition));
            json_object_set_new(j, "sent_offset", json_integer(sent[i].offset));
        }
        json_array_append_new(out, j);
    }
    if (as_json)
        ctl_print_json(stdout, out);
    else {
        json_decref(out);
        ctl_table_print(t, stdout);
    }
    ctl_table_free(t);
    if (rk)
        rd_kafka_destroy(rk);
    free(sent);
    free(sel);
    return rc;
}

int ctl_dlq(int argc, char **argv)
{
    struct filters f = {0};
    struct dlq_ctx c = {0};
    char err[512];
    int as_json = 0, dry_run = 0, rc;

    if (argc < 2) {
        fprintf(stderr,
                "chargectl dlq: missing subcommand (list, show, replay; see --help)\n");
        return CTL_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "list") && strcmp(sub, "show") && strcmp(sub, "replay")) {
        fprintf(stderr, "chargectl dlq: unknown subcommand '%s' (list, show, replay)\n",
                sub);
        return CTL_USAGE;
    }
    /* A negative position would read as options ("-1:0" is -1 -: -0). */
    for (int i = 2; strcmp(sub, "list") != 0 && i < argc; i++)
        if (argv[i][0] == '-' && argv[i][1] >= '0' && argv[i][1] <= '9')
            return check_positions(sub, 1, argv + i);
    rc = parse_opts(argc - 1, argv + 1, &f, &as_json, &dry_run);
    if (rc == -1)
        return CTL_OK;
    if (rc != CTL_OK)
        return rc;
    int nargs = argc - 1 - optind;
    if ((!strcmp(sub, "list") && nargs != 0) || (!strcmp(sub, "show") && nargs != 1)) {
        fprintf(stderr, "chargectl dlq %s: %s\n", sub,
                !strcmp(sub, "show") ? "give exactly one PARTITION:OFFSET"
                                     : "takes no positional argument");
        return CTL_USAGE;
    }
    if (dry_run && strcmp(sub, "replay") != 0) {
        fprintf(stderr, "chargectl dlq %s: --dry-run is for replay\n", sub);
        return CTL_USAGE;
    }
    if (!strcmp(sub, "show") && f.given) {
        fprintf(stderr, "chargectl dlq show: takes no filters or --limit (--%s)\n",
                f.given);
        return CTL_USAGE;
    }
    if (strcmp(sub, "list") != 0 &&
        check_positions(sub, nargs, argv + 1 + optind) != CTL_OK)
        return CTL_USAGE;
    c.cfg = ctl_config("dlq");
    if (!c.cfg)
        return CTL_USAGE;
    c.topic = config_str(c.cfg, CONFIG_CHARGE_DLQ_TOPIC);
    rc = open_reader(&c, err, sizeof(err));
    if (rc != CTL_OK) {
        fprintf(stderr, "chargectl dlq: %s\n", err);
        config_free(c.cfg);
        return rc;
    }
    if (!strcmp(sub, "list"))
        rc = dlq_list(&c, &f, as_json);
    else if (!strcmp(sub, "show"))
        rc = dlq_show(&c, argv[1 + optind], as_json);
    else
        rc = dlq_replay(&c, argc - 1, argv + 1, &f, as_json, dry_run);
    rd_kafka_consumer_close(c.consumer);
    rd_kafka_destroy(c.consumer);
    for (size_t i = 0; i < c.n; i++)
        letter_release(&c.letters[i]);
    free(c.letters);
    config_free(c.cfg);
    return rc;
}
