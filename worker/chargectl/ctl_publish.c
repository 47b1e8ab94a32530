/* chargectl publish: validate charge and refund commands and publish
 * them, keyed by payment_attempt_id, to the commands topic. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <uuid/uuid.h>

#include "charge_command.h"
#include "command_fields.h"
#include "refund_command.h"
#include "chargectl.h"
#include "config.h"
#include "kafka_setup.h"
#include "log.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl publish [flags]\n"
        "       chargectl publish --file FILE [--json]\n\n"
        "Validates charge commands against the contract and publishes them to\n"
        "CHARGE_COMMANDS_TOPIC keyed by payment_attempt_id. Nothing is sent when\n"
        "any command is invalid. With --file, a line may also be a refund command\n"
        "(\"type\": \"refund.requested\"), keyed by the payment_attempt_id it "
        "refunds.\n\n"
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

int ctl_publish(int argc, char **argv)
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
    const char *attempt = NULL, *order = NULL, *key = NULL, *amount = NULL;
    const char *currency = NULL, *pm = NULL, *customer = NULL, *file = NULL;
    char *metadata[32];
    int nmeta = 0, as_json = 0, c, rc = CTL_FAILED;
    struct pending *msgs = NULL;
    size_t n = 0, cap = 0;
    int oom = 0;
    config_t *cfg = NULL;
    rd_kafka_t *rk = NULL;
    char err[512];

    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'a':
            attempt = optarg;
            break;
        case 'o':
            order = optarg;
            break;
        case 'k':
            key = optarg;
            break;
        case 'n':
            amount = optarg;
            break;
        case 'c':
            currency = optarg;
            break;
        case 'p':
            pm = optarg;
            break;
        case 'u':
            customer = optarg;
            break;
        case 'f':
            file = optarg;
            break;
        case 'j':
            as_json = 1;
            break;
        case 'm':
            if (nmeta == 32) {
                fprintf(stderr, "chargectl publish: too many --metadata\n");
                return CTL_USAGE;
            }
            metadata[nmeta++] = optarg;
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
    cfg = ctl_config("publish");
    if (!cfg)
        return CTL_USAGE;

    /* Read and validate everything before sending anything. */
    const struct charge_command_limits limits = {.max_bytes = 1024 * 1024,
                                                 .max_amount = 100000000000LL,
                                                 .allowed_currencies = NULL};
    if (file) {
        FILE *f = strcmp(file, "-") ? fopen(file, "r") : stdin;
        char *line = NULL;
        size_t lcap = 0;
        ssize_t len;
        int lineno = 0;
        if (!f) {
            fprintf(stderr, "chargectl publish: cannot open '%s'\n", file);
            rc = CTL_USAGE;
            goto out;
        }
        while ((len = getline(&line, &lcap, f)) >= 0) {
            lineno++;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
                line[--len] = '\0';
            if (len == 0)
                continue;
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 256;
                struct pending *m = realloc(msgs, ncap * sizeof(*msgs));
                if (!m) {
                    oom = 1;
                    break;
                }
                msgs = m;
                cap = ncap;
            }
            msgs[n] = (struct pending){.value = strdup(line)};
            if (!msgs[n].value) {
                oom = 1;
                break;
            }
            n++;
        }
        free(line);
        if (f != stdin)
            fclose(f);
        (void)lineno;
    } else {
        msgs = calloc(1, sizeof(*msgs));
        if (msgs) {
            n = 1;
            msgs[0].value = from_flags(attempt, order, key, amount, currency, pm,
                                       customer, metadata, nmeta);
        }
        oom = !msgs || !msgs[0].value;
    }
    if (oom) {
        fprintf(stderr, "chargectl publish: out of memory\n");
        rc = CTL_FAILED;
        goto out;
    }
    if (n == 0) {
        fprintf(stderr, "chargectl publish: no command to publish\n");
        rc = CTL_USAGE;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        struct charge_command cmd;
        const char *v = msgs[i].value;
        json_t *doc = v ? json_loads(v, 0, NULL) : NULL;
        const char *id = json_string_value(json_object_get(doc, "payment_attempt_id"));
        size_t idlen = id ? strlen(id) : 0;
        enum dead_letter_reason r;
        if (v && command_fields_type_is(v, strlen(v), REFUND_COMMAND_TYPE)) {
            struct refund_command refund;
            r = refund_command_parse(id, idlen, v, strlen(v), limits.max_bytes, &refund,
                                     err, sizeof(err));
            refund_command_release(&refund);
        } else {
            r = charge_command_parse(id, idlen, v, v ? strlen(v) : 0, &limits, &cmd,
                                     err, sizeof(err));
            charge_command_release(&cmd);
        }
        /* The key is the id exactly as the command writes it: the worker
         * compares them byte for byte (cmd's copy is lower-cased). */
        if (r == DEAD_LETTER_NONE)
            msgs[i].key = strdup(id);
        json_decref(doc);
        if (r != DEAD_LETTER_NONE) {
            fprintf(stderr, "chargectl publish: command %zu is invalid (%s): %s\n",
                    i + 1, dead_letter_reason_name(r), err);
            rc = CTL_USAGE;
            goto out;
        }
    }

    rk = kafka_setup_tool_producer(cfg, "chargectl", err, sizeof(err));
    if (!rk) {
        fprintf(stderr, "chargectl publish: %s\n", err);
        rc = CTL_USAGE;
        goto out;
    }
    const char *topic = config_str(cfg, CONFIG_CHARGE_COMMANDS_TOPIC);
    for (size_t i = 0; i < n; i++) {
        rd_kafka_resp_err_t e;
        for (;;) {
            e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic),
                RD_KAFKA_V_KEY(msgs[i].key, strlen(msgs[i].key)),
                RD_KAFKA_V_VALUE(msgs[i].value, strlen(msgs[i].value)),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(&msgs[i].d),
                RD_KAFKA_V_END);
            if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
                break;
            rd_kafka_poll(rk, 100);
        }
        if (e) {
            fprintf(stderr, "chargectl publish: %s\n", rd_kafka_err2str(e));
            goto out;
        }
        rd_kafka_poll(rk, 0);
    }
    if (rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "chargectl publish: broker did not acknowledge within 30 s "
                        "(is Kafka at KAFKA_BOOTSTRAP_SERVERS reachable?)\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].d.err) {
            fprintf(stderr, "chargectl publish: command %zu not published: %s\n", i + 1,
                    rd_kafka_err2str(msgs[i].d.err));
            goto out;
        }
        if (as_json)
            printf("{\"payment_attempt_id\":\"%s\",\"partition\":%d,\"offset\":%lld}\n",
                   msgs[i].key, (int)msgs[i].d.partition, (long long)msgs[i].d.offset);
        else
            printf("published %s to %s [%d] at offset %lld\n", msgs[i].key, topic,
                   (int)msgs[i].d.partition, (long long)msgs[i].d.offset);
    }
    rc = CTL_OK;
out:
    if (rk)
        rd_kafka_destroy(rk);
    for (size_t i = 0; i < n; i++) {
        free(msgs[i].key);
        free(msgs[i].value);
    }
    free(msgs);
    config_free(cfg);
    return rc;
}
