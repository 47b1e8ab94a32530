#include "worker.h"

#include <stdio.h>

#include "charge_op.h"
#include "config.h"
#include "daemon.h"
#include "engine.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: charged worker\n\n"
            "Consumes charge commands and charges each payment attempt at most once.\n"
            "SIGTERM: stop fetching, drain, commit, leave the group and exit within\n"
            "SHUTDOWN_TIMEOUT_MS: 0 when every message taken was finished, 1 when\n"
            "some were left uncommitted (they come back to the group). A second\n"
            "SIGTERM exits at once (status 1).\n\n");
    config_print_help(out, CONFIG_ROLE_WORKER);
}

/* The worker is the engine running the charge. */
static int worker_start(config_t *cfg, const char *id, struct daemon_role *role,
                        char *err, size_t err_size)
{
    return engine_start(cfg, id, &charge_op, role, err, err_size);
}

int worker_main(int argc, char **argv)
{
    static const struct daemon_program program = {"worker", CONFIG_ROLE_WORKER, usage,
                                                  worker_start};
    return daemon_main(argc, argv, &program);
}
