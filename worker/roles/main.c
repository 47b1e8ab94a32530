/* charged: the long-running roles of charged, one per process. */
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "auditor.h"
#include "console.h"
#include "reconciler.h"
#include "relay.h"
#include "worker.h"

struct charged_role {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct charged_role charged_roles[] = {
    {"worker", worker_main,
     "consume charge commands; charge each payment attempt at most once"},
    {"reconciler", reconciler_main,
     "settle attempts whose outcome is unknown by asking the provider"},
    {"relay", relay_main, "publish result events from the outbox"},
    {"api", api_main, "provider webhooks and status queries"},
    {"auditor", auditor_main,
     "match the provider's own books against the ledger; report every mismatch"},
    {"console", console_main,
     "the operator console in a browser: reviews, dead letters, attempts"},
};

#define N_ROLES (sizeof(charged_roles) / sizeof(charged_roles[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: charged <role> [--help]\n\nRoles:\n");
    for (size_t i = 0; i < N_ROLES; i++)
        fprintf(out, "  %-11s %s\n", charged_roles[i].name, charged_roles[i].summary);
    fprintf(out, "\nExit status: 0 done, 1 runtime failure, 2 bad usage or "
                 "configuration.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "charged: missing role (see charged --help)\n");
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < N_ROLES; i++) {
        const struct charged_role *r = &charged_roles[i];
        if (strcmp(argv[1], r->name) != 0)
            continue;
        return r->run(argc - 1, argv + 1);
    }
    fprintf(stderr, "charged: unknown role '%s' (see charged --help)\n", argv[1]);
    return 2;
}
