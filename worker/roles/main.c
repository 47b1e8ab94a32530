/* charged: the long-running roles of charged, one per process. */
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "auditor.h"
#include "console.h"
#include "daemon.h"
#include "op.h"
#include "reconciler.h"
#include "relay.h"
#include "worker.h"

struct charged_role {
    const char *name;
    const struct daemon_role_desc *desc;
    const char *summary;
};

static const struct charged_role charged_roles[] = {
    {"worker", &worker_role,
     "consume charge commands; charge each payment attempt at most once"},
    {"reconciler", &reconciler_role,
     "settle attempts whose outcome is unknown by asking the provider"},
    {"relay", &relay_role, "publish result events from the outbox"},
    {"api", &api_role, "provider webhooks and status queries"},
    {"auditor", &auditor_role,
     "match the provider's own books against the ledger; report every mismatch"},
    {"console", &console_role,
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
    /* The operations' own settings, before any is read or printed. */
    if (payment_ops_add_settings() != 0) {
        fprintf(stderr, "charged: too many settings of the operations\n");
        return 2;
    }
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
        return daemon_role_main(argc - 1, argv + 1, r->desc);
    }
    fprintf(stderr, "charged: unknown role '%s' (see charged --help)\n", argv[1]);
    return 2;
}
