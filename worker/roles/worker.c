#include "worker.h"

#include <stdio.h>

#include "payment_ops.h"
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
static enum charged_rc worker_start(config_t *cfg, const char *id, void **state,
                                    struct charged_error *err)
{
    engine_t *eng = NULL;
    enum charged_rc rc = engine_start(cfg, id, &payment_ops, &eng, err);
    *state = eng;
    return rc;
}

static int64_t worker_step(void *state, int64_t now)
{
    return engine_step(state, now);
}

static const char *worker_not_ready(void *state)
{
    return engine_not_ready(state);
}

static size_t worker_drain(void *state, int64_t deadline)
{
    return engine_drain(state, deadline);
}

static void worker_finish(void *state, int flush_ms)
{
    engine_finish(state, flush_ms);
}

const struct daemon_role_desc worker_role = {
    .name = "worker",
    .config_role = CONFIG_ROLE_WORKER,
    .usage = usage,
    .start = worker_start,
    .step = worker_step,
    .not_ready = worker_not_ready,
    .drain = worker_drain,
    .finish = worker_finish,
};
