/* chargectl publish: validate commands (a charge's, and with --file one of
 * any type the worker takes: each operation's of the table, op.h's check)
 * by the worker's own parsers and publish them, keyed by
 * payment_attempt_id, to the commands topic. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <uuid/uuid.h>

#include "charge_command.h"
#include "command_fields.h"
#include "chargectl.h"
#include "charged_assert.h"
#include "config.h"
#include "kafka_setup.h"
#include "log.h"
#include "op.h"

/* What --help says of the commands: the flags build the table's first
 * operation's (a charge), --file takes every operation's, named by its
 * type ("refund.requested": a refund command). */
static void usage_commands(FILE *out)
{
    char text[2048], nouns[512] = "", types[1024] = "";
    size_t nn = 0, nt = 0, n = payment_operations_count;
    CHARGED_ASSERT(n >= 2);
    for (size_t k = 1; k < n; k++) {
        const char *type = payment_op_of(k)->command_type;
        const char *sep = k == 1 ? "" : k + 1 == n ? " or " : ", ";
        nn += (size_t)snprintf(nouns + nn, sizeof(nouns) - nn, "%s%.*s", sep,
                               (int)strcspn(type, "."), type);
        nt += (size_t)snprintf(types + nt, sizeof(types) - nt, "%s\"%s\"",
                               k == 1 ? "" : ", ", type);
        CHARGED_ASSERT(nn < sizeof(nouns) && nt < sizeof(types));
    }
    int len = snprintf(text, sizeof(text),
                       "Validates %.*s commands against the contract and publishes "
                       "them to CHARGE_COMMANDS_TOPIC keyed by payment_attempt_id. "
                       "Nothing is sent when any command is invalid. With --file, a "
                       "line may also be a %s command (\"type\": %s), keyed by the "
                       "payment_attempt_id it names.",
                       (int)strcspn(payment_op_of(0)->command_type, "."),
                       payment_op_of(0)->command_type, nouns, types);
    CHARGED_ASSERT(len > 0 && (size_t)len < sizeof(text));
    ctl_wrap(out, "", text, 71);
}

static void usage(FILE *out)
{
    fprintf(out, "usage: chargectl publish [flags]\n"
                 "       chargectl publish --file FILE [--json]\n\n");
    usage_commands(out);
    fprintf(
        out,
        "\n"
        "  --attempt-id UUID        payment_attempt_id [a new UUID]\n"
        "  --order-id UUID          order_id [a new UUID]\n"
        "  --idempotency-key KEY    [attempt:<attempt-id>]\n"
        "  --amount N               minor units (required with flags)\n"
        "  --currency CUR           ISO 4217, upper case (required with flags)\n"
        "  --payment-method PM      provider token, e.g. pm_card_visa (required)\n"
        "  --customer-id ID         optional\n"
        "  --metadata KEY=VALUE     repeatable, at most 20\n"
        "  --file FILE              commands as JSON, one object per line ('-' reads\n"
        "                           standard input); flags are not used then\n"
        "  --json                   print what was published as JSON lines\n"
        "  --help                   this text\n\n"
        "Exit status: 0 published, 1 Kafka failed, 2 invalid command or usage.\n");
}

struct pending {
    char *key, *value;
    struct kafka_setup_delivery d;
};

/* Builds one command from the flags; returns its JSON (caller frees). */
static char *from_flags(const char *attempt, const char *order, const char *key,
                        const char *amount, const char *currency, const char *pm,
                        const char *customer, char **metadata, int nmeta)
{
    char a[37], o[37], k[160];
    uuid_t u;
    if (!attempt) {
        uuid_generate_random(u);
        uuid_unparse_lower(u, a);
        attempt = a;
    }
    if (!order) {
        uuid_generate_random(u);
        uuid_unparse_lower(u, o);
        order = o;
    }
    if (!key) {
        snprintf(k, sizeof(k), "attempt:%s", attempt);
        key = k;
    }
    char *end;
    long long amt = amount ? strtoll(amount, &end, 10) : 0;
    json_t *cmd =
        json_pack("{s:s, s:i, s:s, s:s, s:s, s:I, s:s?, s:s?}", "type",
                  "charge.requested", "version", 1, "payment_attempt_id", attempt,
                  "order_id", order, "idempotency_key", key, "amount", (json_int_t)amt,
                  "currency", currency, "payment_method", pm);
    if (!cmd)
        return NULL;
    if (amount && (*end || end == amount))
        json_object_set_new(cmd, "amount", json_string(amount)); /* refused below */
    if (customer)
        json_object_set_new(cmd, "customer_id", json_string(customer));
    if (nmeta > 0) {
        json_t *md = json_object();
        for (int i = 0; i < nmeta; i++) {
            char *eq = strchr(metadata[i], '=');
            if (!eq) {
                json_object_set_new(md, metadata[i], json_null()); /* refused below */
                continue;
            }
            *eq = '\0';
            json_object_set_new(md, metadata[i], json_string(eq + 1));
            *eq = '=';
        }
        json_object_set_new(cmd, "metadata", md);
    }
    char *s = json_dumps(cmd, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(cmd);
    return s;
}

/* What the command line asks for. */
struct publish_args {
    const char *attempt, *order, *key, *amount, *currency, *pm, *customer, *file;
    char *metadata[32];
    int nmeta, as_json;
};

/* The commands to publish, in the order given. */
struct batch {
    struct pending *msgs;
    size_t n, cap;
};

/* Reads the options into a; -1 to go on, else the exit status (--help,
 * or a usage error already said). */
static int parse_args(int argc, char **argv, struct publish_args *a)
{
    static const struct option opts[] = {
        {"attempt-id", required_argument, NULL, 'a'},
        {"order-id", required_argument, NULL, 'o'},
        {"idempotency-key", required_argument, NULL, 'k'},
        {"amount", required_argument, NULL, 'n'},
        {"currency", required_argument, NULL, 'c'},
        {"payment-method", required_argument, NULL, 'p'},
        {"customer-id", required_argument, NULL, 'u'},
        {"metadata", required_argument, NULL, 'm'},
        {"file", required_argument, NULL, 'f'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'a':
            a->attempt = optarg;
            break;
        case 'o':
            a->order = optarg;
            break;
        case 'k':
            a->key = optarg;
            break;
        case 'n':
            a->amount = optarg;
            break;
        case 'c':
            a->currency = optarg;
            break;
        case 'p':
            a->pm = optarg;
            break;
        case 'u':
            a->customer = optarg;
            break;
        case 'f':
            a->file = optarg;
            break;
        case 'j':
            a->as_json = 1;
            break;
        case 'm':
            if (a->nmeta == 32) {
                fprintf(stderr, "chargectl publish: too many --metadata\n");
                return CTL_USAGE;
            }
            a->metadata[a->nmeta++] = optarg;
            break;
        case 'h':
            usage(stdout);
            return CTL_OK;
        default:
            return ctl_bad_option("publish", argv[optind - 1]);
        }
    }
    if (optind != argc)
        return ctl_unexpected_argument("publish", argv[optind]);
    return -1;
}

/* Appends a copy of line; -1 when out of memory. */
static int batch_add(struct batch *b, const char *line)
{
    if (b->n == b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 256;
        struct pending *m = realloc(b->msgs, ncap * sizeof(*b->msgs));
        if (!m)
            return -1;
        b->msgs = m;
        b->cap = ncap;
    }
    b->msgs[b->n] = (struct pending){.value = strdup(line)};
    if (!b->msgs[b->n].value)
        return -1;
    b->n++;
    return 0;
}

/* Every non-empty line of the file ('-': standard input); 0, -1 when out
 * of memory, or CTL_USAGE (said) when the file cannot be opened. */
static int read_file(const char *file, struct batch *b)
{
    FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int rc = 0;
    if (!f) {
        fprintf(stderr, "chargectl publish: cannot open '%s'\n", file);
        return CTL_USAGE;
    }
    while (rc == 0 && (len = getline(&line, &lcap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len > 0)
            rc = batch_add(b, line);
    }
    free(line);
    if (f != stdin)
        fclose(f);
    return rc;
}

/* The commands, from the file or from the flags: CTL_OK, or the exit
 * status (said). */
static int read_commands(struct publish_args *a, struct batch *b)
{
    int oom;
    if (a->file) {
        int rc = read_file(a->file, b);
        if (rc == CTL_USAGE)
            return rc;
        oom = rc != 0;
    } else {
        b->msgs = calloc(1, sizeof(*b->msgs));
        if (b->msgs) {
            b->n = 1;
            b->msgs[0].value =
                from_flags(a->attempt, a->order, a->key, a->amount, a->currency, a->pm,
                           a->customer, a->metadata, a->nmeta);
        }
        oom = !b->msgs || !b->msgs[0].value;
    }
    if (oom) {
        fprintf(stderr, "chargectl publish: out of memory\n");
        return CTL_FAILED;
    }
    if (b->n == 0) {
        fprintf(stderr, "chargectl publish: no command to publish\n");
        return CTL_USAGE;
    }
    return CTL_OK;
}

/* Parses one command by the check of the operation of its type, as the
 * worker does (the table's first operation's, a charge's, unless it names
 * another type the worker takes): DEAD_LETTER_NONE, or why not and err.
 * id (NULL: none) is the key it would be sent with. */
static enum dead_letter_reason parse_any(const char *id, const char *v,
                                         struct charged_error *err)
{
    const struct charge_command_limits limits = {.max_bytes = 1024 * 1024,
                                                 .max_amount = 100000000000LL,
                                                 .allowed_currencies = NULL};
    size_t idlen = id ? strlen(id) : 0, len = v ? strlen(v) : 0;
    const struct payment_op *first = payment_op_of(0);
    for (size_t k = 1; v && k < payment_operations_count; k++) {
        const struct payment_op *op = payment_op_of(k);
        if (op->check && command_fields_type_is(v, len, op->command_type))
            return op->check(id, idlen, v, len, &limits, err);
    }
    /* The first guess checks every command (its own type's or none). */
    CHARGED_ASSERT(first->check != NULL);
    return first->check(id, idlen, v, len, &limits, err);
}

/* Checks one command against the contract and, when valid, keys it:
 * DEAD_LETTER_NONE, or why not and err. */
static enum dead_letter_reason validate_one(struct pending *m,
                                            struct charged_error *err)
{
    const char *v = m->value;
    json_t *doc = v ? json_loads(v, 0, NULL) : NULL;
    const char *id = json_string_value(json_object_get(doc, "payment_attempt_id"));
    enum dead_letter_reason r = parse_any(id, v, err);
    CHARGED_ASSERT(r != DEAD_LETTER_NONE || id != NULL);
    /* The key is the id exactly as the command writes it: the worker
     * compares them byte for byte (cmd's copy is lower-cased). */
    if (r == DEAD_LETTER_NONE)
        m->key = strdup(id);
    json_decref(doc);
    return r;
}

/* Every command valid before anything is sent: CTL_OK or CTL_USAGE (said). */
static int validate_all(struct batch *b)
{
    struct charged_error err;
    for (size_t i = 0; i < b->n; i++) {
        enum dead_letter_reason r = validate_one(&b->msgs[i], &err);
        if (r != DEAD_LETTER_NONE) {
            fprintf(stderr, "chargectl publish: command %zu is invalid (%s): %s\n",
                    i + 1, dead_letter_reason_name(r), err.message);
            return CTL_USAGE;
        }
    }
    return CTL_OK;
}

/* Queues every command and waits for the broker's acknowledgements:
 * CTL_OK, or CTL_FAILED (said). */
static int produce_all(rd_kafka_t *rk, const char *topic, struct batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        struct pending *m = &b->msgs[i];
        rd_kafka_resp_err_t e;
        for (;;) {
            e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                                  RD_KAFKA_V_KEY(m->key, strlen(m->key)),
                                  RD_KAFKA_V_VALUE(m->value, strlen(m->value)),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                  RD_KAFKA_V_OPAQUE(&m->d), RD_KAFKA_V_END);
            if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
                break;
            rd_kafka_poll(rk, 100);
        }
        if (e) {
            fprintf(stderr, "chargectl publish: %s\n", rd_kafka_err2str(e));
            return CTL_FAILED;
        }
        rd_kafka_poll(rk, 0);
    }
    if (rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "chargectl publish: broker did not acknowledge within 30 s "
                        "(is Kafka at KAFKA_BOOTSTRAP_SERVERS reachable?)\n");
        return CTL_FAILED;
    }
    return CTL_OK;
}

/* One line a command published, in order, up to the first the broker
 * refused: CTL_OK, or CTL_FAILED (said). */
static int report(const struct batch *b, const char *topic, int as_json)
{
    for (size_t i = 0; i < b->n; i++) {
        const struct pending *m = &b->msgs[i];
        if (m->d.err) {
            fprintf(stderr, "chargectl publish: command %zu not published: %s\n", i + 1,
                    rd_kafka_err2str(m->d.err));
            return CTL_FAILED;
        }
        if (as_json)
            printf("{\"payment_attempt_id\":\"%s\",\"partition\":%d,\"offset\":%lld}\n",
                   m->key, (int)m->d.partition, (long long)m->d.offset);
        else
            printf("published %s to %s [%d] at offset %lld\n", m->key, topic,
                   (int)m->d.partition, (long long)m->d.offset);
    }
    return CTL_OK;
}

/* Sends the batch, all valid, to the commands topic. */
static int publish(config_t *cfg, struct batch *b, int as_json)
{
    struct charged_error err;
    rd_kafka_t *rk = kafka_setup_tool_producer(cfg, "chargectl", &err);
    if (!rk) {
        fprintf(stderr, "chargectl publish: %s\n", err.message);
        return CTL_USAGE;
    }
    const char *topic = config_str(cfg, CONFIG_CHARGE_COMMANDS_TOPIC);
    int rc = produce_all(rk, topic, b);
    if (rc == CTL_OK)
        rc = report(b, topic, as_json);
    rd_kafka_destroy(rk);
    return rc;
}

int ctl_publish(int argc, char **argv)
{
    struct publish_args a = {0};
    struct batch b = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    config_t *cfg = ctl_config("publish");
    if (!cfg)
        return CTL_USAGE;
    /* Read and validate everything before sending anything. */
    if ((rc = read_commands(&a, &b)) == CTL_OK && (rc = validate_all(&b)) == CTL_OK)
        rc = publish(cfg, &b, a.as_json);
    for (size_t i = 0; i < b.n; i++) {
        free(b.msgs[i].key);
        free(b.msgs[i].value);
    }
    free(b.msgs);
    config_free(cfg);
    return rc;
}
