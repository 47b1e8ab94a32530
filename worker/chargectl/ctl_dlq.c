/* chargectl dlq: list, show and replay dead letters; the reading, the
 * selection, the JSON and the replay are dlq_reader's, shared with the
 * console, and this file only parses options and prints. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "charge_command.h"
#include "chargectl.h"
#include "decimal.h"
#include "config.h"
#include "clock.h"
#include "ctl_output.h"
#include "dead_letter_reason.h"
#include "dlq_reader.h"
#include "utf8_text.h"

#define MAX_ACTOR 128

struct opts {
    struct dlq_filters f;
    const char *given; /* the first filter (or limit) option given, by name */
    const char *actor; /* --actor, NULL when not given */
};

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
    OPT_ACTOR,
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
    {"actor", required_argument, NULL, OPT_ACTOR},
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
        "       chargectl dlq replay (PARTITION:OFFSET... | filters) [--dry-run]\n"
        "                            [--actor NAME] [--json]\n\n"
        "Reads CHARGE_DLQ_TOPIC without committing any offset and without removing\n"
        "anything.\n\n"
        "  list     one line per dead letter: position, time, reason code, attempt\n"
        "           and order ids, first error line; the newest --limit, oldest first\n"
        "  show     the whole dead letter: headers, key, value (pretty JSON when it "
        "is\n"
        "           JSON, bytes escaped as \\xNN when not)\n"
        "  replay   sends dead letters back to the command topic (the only one it\n"
        "           produces to; a letter naming another is refused) with their\n"
        "           key, value and original headers plus dlq.replayed_from and\n"
        "           dlq.replayed_by (--actor); the worker treats them as any\n"
        "           command, so a replay never charges twice.\n"
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
        "  --dry-run          replay: show what would be sent, send nothing (with\n"
        "                     --json, each message, card digits masked)\n"
        "  --actor NAME       replay: who replays, in dlq.replayed_by [the OS user]\n"
        "  --help             this text\n\n"
        "Exit status: 0 done, 1 Kafka unreachable or no such letter, 2 bad usage.\n");
}

/* Parses options; positional arguments are left in argv[optind..]. */
static int parse_opts(int argc, char **argv, struct opts *f, int *as_json, int *dry_run)
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
            f->f.reason = optarg;
            break;
        case OPT_SINCE:
        case OPT_UNTIL: {
            int64_t t;
            if (clock_parse_time_ms(optarg, &t) != 0) {
                fprintf(stderr,
                        "chargectl dlq: %s '%s' is not an RFC 3339 UTC time or a "
                        "duration (30s, 15m, 2h, 7d)\n",
                        c == OPT_SINCE ? "--since" : "--until", optarg);
                return CTL_USAGE;
            }
            if (c == OPT_SINCE)
                f->f.since_ms = t, f->f.have_since = 1;
            else
                f->f.until_ms = t, f->f.have_until = 1;
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
                f->f.attempt = optarg;
            else
                f->f.order = optarg;
            break;
        case OPT_LIMIT:
            if (decimal_parse(optarg, INT64_MAX, &f->f.limit, NULL) != 0 ||
                f->f.limit < 1) {
                fprintf(stderr,
                        "chargectl dlq: --limit '%s' is not a whole number from 1 up\n",
                        optarg);
                return CTL_USAGE;
            }
            break;
        case OPT_ACTOR:
            f->actor = optarg;
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

/* Checks every position before anything is read: exit 2, one line. */
static int check_positions(const char *sub, int n, char **args)
{
    int32_t p;
    int64_t o;
    for (int i = 0; i < n; i++) {
        if (dlq_position_parse(args[i], &p, &o) != 0) {
            fprintf(stderr,
                    "chargectl dlq %s: '%s' is not PARTITION:OFFSET (partition "
                    "0..%d, offset 0..%lld)\n",
                    sub, args[i], INT32_MAX, (long long)INT64_MAX);
            return CTL_USAGE;
        }
    }
    return CTL_OK;
}

/* 1..MAX_ACTOR bytes of UTF-8 on one line: it goes into a header. */
static int good_actor(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > MAX_ACTOR || !utf8_text_valid(s, n))
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

/* Prints what bytes_json made of some bytes (a string, {"hex": ...} or
 * null) as print_escaped prints the bytes. */
static void print_json_bytes(json_t *v)
{
    const char *hex = json_string_value(json_object_get(v, "hex"));
    if (json_is_string(v)) {
        print_escaped(stdout, json_string_value(v), json_string_length(v));
    } else if (hex) {
        for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) {
            char byte;
            unsigned int b;
            sscanf(hex + i, "%2x", &b);
            byte = (char)b;
            print_escaped(stdout, &byte, 1);
        }
    } else {
        printf("(null)");
    }
}

static void position(const struct dlq_letter *l, char *out, size_t size)
{
    snprintf(out, size, "%d:%lld", (int)l->partition, (long long)l->offset);
}

/* ---- subcommands ---- */

static int dlq_list(dlq_reader_t *r, const struct opts *o, int as_json)
{
    struct charged_error err;
    size_t n = 0;
    if (dlq_reader_read_all(r, &err) != CHARGED_OK) {
        fprintf(stderr, "chargectl dlq list: %s\n", err.message);
        return CTL_FAILED;
    }
    struct dlq_filters lf = o->f;
    if (lf.limit == 0)
        lf.limit = 100;
    const struct dlq_letter **sel = dlq_reader_select(r, &lf, &n);
    if (!sel) {
        fprintf(stderr, "chargectl dlq list: out of memory\n");
        return CTL_FAILED;
    }
    if (as_json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(arr, dlq_letter_summary_json(sel[i]));
        ctl_print_json(stdout, arr);
    } else {
        const char *hdr[] = {"POSITION", "FAILED_AT", "REASON", "ATTEMPT",
                             "ORDER",    "ERROR",     NULL};
        ctl_table_t *t = ctl_table_new(hdr);
        for (size_t i = 0; i < n; i++) {
            char pos[48];
            position(sel[i], pos, sizeof(pos));
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

static int dlq_show(dlq_reader_t *r, const config_t *cfg, const char *pos, int as_json)
{
    struct charged_error err;
    int32_t p;
    int64_t o;
    if (dlq_position_parse(pos, &p, &o) != 0) {
        fprintf(stderr, "chargectl dlq show: '%s' is not PARTITION:OFFSET\n", pos);
        return CTL_USAGE;
    }
    if (dlq_reader_read_one(r, p, o, &err) != CHARGED_OK) {
        fprintf(stderr, "chargectl dlq show: %s\n", err.message);
        return CTL_FAILED;
    }
    const struct dlq_letter *l = dlq_reader_letter(r, 0);
    /* The headers, as the letter holds them (show is the letter itself:
     * unmasked, as chargectl always printed it). */
    json_t *j = dlq_letter_json(r, l, 0);
    if (as_json) {
        ctl_print_json(stdout, j);
        return CTL_OK;
    }
    printf("position:  %s:%d:%lld\n", config_str(cfg, CONFIG_CHARGE_DLQ_TOPIC),
           (int)l->partition, (long long)l->offset);
    printf("headers:\n");
    size_t i;
    json_t *h;
    json_array_foreach(json_object_get(j, "headers"), i, h)
    {
        printf("  ");
        print_json_bytes(json_array_get(h, 0));
        printf(": ");
        print_json_bytes(json_array_get(h, 1));
        putchar('\n');
    }
    json_decref(j);
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

/* The letters named by position, in the order given, or those the filters
 * select; NULL (having said why) with *rc. */
static const struct dlq_letter **replay_selection(dlq_reader_t *r, int argc,
                                                  char **argv, const struct opts *o,
                                                  size_t *n, int *rc)
{
    struct charged_error err;
    const struct dlq_letter **sel;
    *rc = CTL_FAILED;
    if (optind < argc) {
        for (int i = optind; i < argc; i++) {
            int32_t p;
            int64_t off;
            if (dlq_position_parse(argv[i], &p, &off) != 0) {
                fprintf(stderr, "chargectl dlq replay: '%s' is not PARTITION:OFFSET\n",
                        argv[i]);
                *rc = CTL_USAGE;
                return NULL;
            }
            if (dlq_reader_read_one(r, p, off, &err) != CHARGED_OK) {
                fprintf(stderr, "chargectl dlq replay: %s\n", err.message);
                return NULL;
            }
        }
        *n = dlq_reader_count(r);
        if (!(sel = calloc(*n + 1, sizeof(*sel))))
            goto oom;
        for (size_t i = 0; i < *n; i++)
            sel[i] = dlq_reader_letter(r, i);
        /* Named by position, a card letter is an error, not a skip. */
        for (size_t i = 0; i < *n; i++) {
            if (sel[i]->reason && !strcmp(sel[i]->reason, "card_data_refused")) {
                fprintf(stderr,
                        "chargectl dlq replay: %d:%lld is card_data_refused: its card "
                        "digits are masked, so it cannot be replayed; the sender must "
                        "send a clean command\n",
                        (int)sel[i]->partition, (long long)sel[i]->offset);
                free(sel);
                return NULL;
            }
        }
        return sel;
    }
    if (dlq_reader_read_all(r, &err) != CHARGED_OK) {
        fprintf(stderr, "chargectl dlq replay: %s\n", err.message);
        return NULL;
    }
    if ((sel = dlq_reader_select(r, &o->f, n)))
        return sel;
oom:
    fprintf(stderr, "chargectl dlq replay: out of memory\n");
    return NULL;
}

static int dlq_replay(dlq_reader_t *r, const config_t *cfg, int argc, char **argv,
                      const struct opts *o, int as_json, int dry_run)
{
    struct charged_error err;
    const char *topic = config_str(cfg, CONFIG_CHARGE_DLQ_TOPIC);
    size_t n = 0;
    int rc;
    const struct dlq_letter **sel = replay_selection(r, argc, argv, o, &n, &rc);
    if (!sel)
        return rc;
    struct dlq_replay_item *items = calloc(n + 1, sizeof(*items));
    if (!items) {
        fprintf(stderr, "chargectl dlq replay: out of memory\n");
        free(sel);
        return CTL_FAILED;
    }
    enum charged_rc rrc = dlq_reader_replay(r, sel, n, o->actor, dry_run, items, &err);
    if (rrc == CHARGED_BAD_ITEM) {
        fprintf(stderr, "chargectl dlq replay: %s\n", err.message);
        free(items);
        free(sel);
        return CTL_FAILED;
    }
    rc = rrc == CHARGED_OK ? CTL_OK : CTL_FAILED;
    if (rrc != CHARGED_OK)
        fprintf(stderr, "chargectl dlq replay: %s\n", err.message);
    json_t *out = json_array();
    const char *hdr[] = {"POSITION", "REASON", "ATTEMPT", "TO", "RESULT", NULL};
    ctl_table_t *t = ctl_table_new(hdr);
    /* Skipped letters first, then (when sending) the sent ones: the order
     * chargectl always printed. */
    for (size_t i = 0; i < n; i++) {
        const struct dlq_letter *l = items[i].letter;
        char pos[48], from[320];
        position(l, pos, sizeof(pos));
        if (items[i].skipped) {
            const char *row[] = {pos, l->reason, l->attempt, l->orig_topic,
                                 "skipped: card digits masked"};
            ctl_table_add(t, row);
            json_array_append_new(out,
                                  json_pack("{s:s, s:s, s:b}", "position", pos,
                                            "skipped", "card_data_refused", "sent", 0));
        } else if (dry_run) {
            const char *row[] = {pos, l->reason, l->attempt, l->orig_topic,
                                 "would send"};
            ctl_table_add(t, row);
            snprintf(from, sizeof(from), "%s:%s", topic, pos);
            json_t *j = dlq_letter_summary_json(l);
            json_object_set_new(j, "sent", json_false());
            json_object_set_new(j, "replayed_from", json_string(from));
            json_object_set_new(j, "message",
                                dlq_replay_message_json(r, l, o->actor, 1));
            json_array_append_new(out, j);
        }
    }
    for (size_t i = 0; !dry_run && i < n; i++) {
        const struct dlq_letter *l = items[i].letter;
        char pos[48], result[200];
        if (items[i].skipped)
            continue;
        position(l, pos, sizeof(pos));
        if (items[i].sent)
            snprintf(result, sizeof(result), "sent to [%d] at offset %lld",
                     (int)items[i].to_partition, (long long)items[i].to_offset);
        else
            snprintf(result, sizeof(result), "failed: %s", items[i].error);
        const char *row[] = {pos, l->reason, l->attempt, l->orig_topic, result};
        ctl_table_add(t, row);
        json_t *j = dlq_letter_summary_json(l);
        json_object_set_new(j, "sent", json_boolean(items[i].sent));
        if (items[i].sent) {
            json_object_set_new(j, "sent_partition",
                                json_integer(items[i].to_partition));
            json_object_set_new(j, "sent_offset", json_integer(items[i].to_offset));
        }
        json_array_append_new(out, j);
    }
    if (as_json) {
        ctl_print_json(stdout, out);
    } else {
        json_decref(out);
        ctl_table_print(t, stdout);
    }
    ctl_table_free(t);
    free(items);
    free(sel);
    return rc;
}

int ctl_dlq(int argc, char **argv)
{
    struct opts o = {0};
    struct charged_error err;
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
    rc = parse_opts(argc - 1, argv + 1, &o, &as_json, &dry_run);
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
    if ((dry_run || o.actor) && strcmp(sub, "replay") != 0) {
        fprintf(stderr, "chargectl dlq %s: --%s is for replay\n", sub,
                dry_run ? "dry-run" : "actor");
        return CTL_USAGE;
    }
    if (!strcmp(sub, "show") && o.given) {
        fprintf(stderr, "chargectl dlq show: takes no filters or --limit (--%s)\n",
                o.given);
        return CTL_USAGE;
    }
    if (strcmp(sub, "list") != 0 &&
        check_positions(sub, nargs, argv + 1 + optind) != CTL_OK)
        return CTL_USAGE;
    if (!strcmp(sub, "replay")) {
        if (nargs > 0 && o.given) {
            fprintf(
                stderr,
                "chargectl dlq replay: give positions or filters, not both (--%s)\n",
                o.given);
            return CTL_USAGE;
        }
        if (nargs == 0 && !(o.f.reason || o.f.attempt || o.f.order || o.f.have_since ||
                            o.f.have_until)) {
            fprintf(stderr,
                    "chargectl dlq replay: name the letters: PARTITION:OFFSET... "
                    "or at least one filter\n");
            return CTL_USAGE;
        }
        if (!o.actor && !(o.actor = ctl_os_user())) {
            fprintf(stderr, "chargectl dlq replay: cannot tell who you are: give "
                            "--actor NAME\n");
            return CTL_USAGE;
        }
        if (!good_actor(o.actor)) {
            fprintf(stderr,
                    "chargectl dlq replay: --actor must be 1..%d bytes of UTF-8 on one "
                    "line\n",
                    MAX_ACTOR);
            return CTL_USAGE;
        }
    }
    config_t *cfg = ctl_config("dlq");
    if (!cfg)
        return CTL_USAGE;
    dlq_reader_t *r = dlq_reader_new(cfg, &err);
    if (!r) {
        fprintf(stderr, "chargectl dlq: %s\n", err.message);
        config_free(cfg);
        return CTL_USAGE;
    }
    if (!strcmp(sub, "list"))
        rc = dlq_list(r, &o, as_json);
    else if (!strcmp(sub, "show"))
        rc = dlq_show(r, cfg, argv[1 + optind], as_json);
    else
        rc = dlq_replay(r, cfg, argc - 1, argv + 1, &o, as_json, dry_run);
    dlq_reader_free(r);
    config_free(cfg);
    return rc;
}
