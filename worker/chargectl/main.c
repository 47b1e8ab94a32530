/* chargectl: operator CLI of charged. */
#include <stdio.h>
#include <string.h>

#include "chargectl.h"
#include "config.h"
#include "op.h"

struct ctl_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    const struct step_review_kind *review; /* run is ctl_step's of it */
};

/* The commands before the operations' reviews, and after. */
#define CTL_BEFORE_REVIEWS 5

static const struct ctl_command ctl_commands[] = {
    {"migrate", ctl_migrate, "apply pending database migrations", NULL},
    {"publish", ctl_publish, "validate and publish charge commands", NULL},
    {"dlq", ctl_dlq, "list, show and replay dead letters", NULL},
    {"attempt", ctl_attempt,
     "show an attempt's history, list attempts, resolve reviews", NULL},
    {"refund", ctl_refund, "show a refund's history, list refunds, resolve reviews",
     NULL},
    {"audit", ctl_audit, "the auditor's verdicts and findings; audit a window now",
     NULL},
    {"console", ctl_console, "the operator console's access tokens", NULL},
    {"provider", ctl_provider, "the provider's rate budget: show and set its limits",
     NULL},
};

#define CTL_FIXED (sizeof(ctl_commands) / sizeof(ctl_commands[0]))
_Static_assert(CTL_BEFORE_REVIEWS <= CTL_FIXED, "the reviews go among the commands");

/* Every command into all, in --help's order: the fixed ones, with the
 * table's reviews (by cli_rank) after the first CTL_BEFORE_REVIEWS. */
static size_t commands(struct ctl_command all[CTL_FIXED + PAYMENT_OPS_MAX])
{
    const struct step_review_kind *r[PAYMENT_OPS_MAX];
    size_t nr = payment_ops_reviews(r), n = 0;
    for (size_t i = 1; i < nr; i++) /* few: insertion */
        for (size_t j = i; j > 0 && r[j]->cli_rank < r[j - 1]->cli_rank; j--) {
            const struct step_review_kind *t = r[j];
            r[j] = r[j - 1];
            r[j - 1] = t;
        }
    for (size_t i = 0; i < CTL_BEFORE_REVIEWS; i++)
        all[n++] = ctl_commands[i];
    for (size_t i = 0; i < nr; i++)
        all[n++] = (struct ctl_command){r[i]->noun, NULL, r[i]->summary, r[i]};
    for (size_t i = CTL_BEFORE_REVIEWS; i < CTL_FIXED; i++)
        all[n++] = ctl_commands[i];
    return n;
}

static void usage(FILE *out, const struct ctl_command *all, size_t n)
{
    fprintf(out,
            "usage: chargectl <command> [options]   (chargectl <command> --help)\n\n"
            "Commands:\n");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "  %-14s %s\n", all[i].name, all[i].summary);
    fputc('\n', out);
    config_print_help(out, CONFIG_ROLE_CTL);
}

int main(int argc, char **argv)
{
    struct ctl_command all[CTL_FIXED + PAYMENT_OPS_MAX];
    size_t n = commands(all);
    if (argc < 2) {
        fprintf(stderr, "chargectl: missing command (see chargectl --help)\n");
        return CTL_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout, all, n);
        return CTL_OK;
    }
    for (size_t i = 0; i < n; i++)
        if (!strcmp(argv[1], all[i].name))
            return all[i].review ? ctl_step(all[i].review, argc - 1, argv + 1)
                                 : all[i].run(argc - 1, argv + 1);
    fprintf(stderr, "chargectl: unknown command '%s' (see chargectl --help)\n",
            argv[1]);
    return CTL_USAGE;
}
