/* charged: the long-running roles of charged, one per process. */
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "config.h"
#include "reconciler.h"
#include "relay.h"
#include "worker.h"

struct charged_role {
    const char *name;
    unsigned mask;
    int (*run)(int argc, char **argv);
    const char *summary;
};

static const struct charged_role charged_roles[] = {
    {"worker", CONFIG_ROLE_WORKER, worker_main,
     "consume charge commands; charge each payment attempt at most once"},
    {"reconciler", CONFIG_ROLE_RECONCILER, reconciler_main,
     "settle attempts whose outcome is unknown by asking the provider"},
    {"relay", CONFIG_ROLE_RELAY, relay_main, "publish result events from the outbox"},
    {"api", CONFIG_ROLE_API, api_main, "provider webhooks and status queries"},
};

#define N_ROLES (sizeof(charged_roles) / sizeof(charged_roles[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: charged <role> [--help]\n\nRoles:\n");
    for (size_t i = 0; i < N_ROLES; i++)
        fprintf(out, "  %-11s %s%s\n", charged_roles[i].name, charged_roles[i].summary,
                charged_roles[i].run ? "" : " (not built yet)");
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
        if (!r->run && argc > 2 &&
            (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            printf("usage: charged %s\n\n%s.\n\n", r->name, r->summary);
            config_print_help(stdout, r->mask);
            return 0;
        }
        if (!r->run) {
            fprintf(stderr, "charged: role '%s' is not built yet\n", r->name);
            return 2;
        }
        return r->run(argc - 1, argv + 1);
    }
    fprintf(stderr, "charged: unknown role '%s' (see charged --help)\n", argv[1]);
    return 2;
}
