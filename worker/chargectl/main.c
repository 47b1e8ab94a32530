/* chargectl: operator CLI of charged. */
#include <stdio.h>
#include <string.h>

#include "chargectl.h"
#include "config.h"

struct ctl_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct ctl_command ctl_commands[] = {
    {"migrate", ctl_migrate, "apply pending database migrations"},
    {"publish", ctl_publish, "validate and publish charge commands"},
    {"dlq", ctl_dlq, "list, show and replay dead letters"},
    {"attempt", ctl_attempt,
     "show an attempt's history, list attempts, resolve reviews"},
    {"refund", ctl_refund, "show a refund's history, list refunds, resolve reviews"},
    {"capture", ctl_capture, "list captures, resolve their reviews"},
    {"void", ctl_void, "list voids, resolve their reviews"},
    {"authorization", ctl_authorization, "list authorizations, resolve their reviews"},
    {"audit", ctl_audit, "the auditor's verdicts and findings; audit a window now"},
    {"console", ctl_console, "the operator console's access tokens"},
    {"provider", ctl_provider, "the provider's rate budget: show and set its limits"},
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: chargectl <command> [options]   (chargectl <command> --help)\n\n"
            "Commands:\n");
    for (size_t i = 0; i < sizeof(ctl_commands) / sizeof(ctl_commands[0]); i++)
        fprintf(out, "  %-14s %s\n", ctl_commands[i].name, ctl_commands[i].summary);
    fputc('\n', out);
    config_print_help(out, CONFIG_ROLE_CTL);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "chargectl: missing command (see chargectl --help)\n");
        return CTL_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(stdout);
        return CTL_OK;
    }
    for (size_t i = 0; i < sizeof(ctl_commands) / sizeof(ctl_commands[0]); i++)
        if (!strcmp(argv[1], ctl_commands[i].name))
            return ctl_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "chargectl: unknown command '%s' (see chargectl --help)\n",
            argv[1]);
    return CTL_USAGE;
}
