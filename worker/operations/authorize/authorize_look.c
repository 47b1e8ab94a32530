/* The authorization's face for the reconciler (op.h's struct
 * op_reconcile): the charge's look at a payment attempt (attempt_look.h),
 * of the attempts with capture_method manual only, in its own order of
 * evidence (authorize_policy.h: the charge's with the hold's meanings): an
 * intent in requires_capture is AUTHORIZED, never SUCCEEDED. It also looks
 * at the holds older than RECONCILER_AUTHORIZATION_EXPIRY_MS, by their
 * recorded intent, for the provider's expiry whose webhook never came. */
#include "attempt_look.h"
#include "attempt_store.h"
#include "authorize.h"
#include "authorize_policy.h"
#include "charged_assert.h"
#include "metrics.h"
#include "op.h"
#include "op_shared.h"

/* The authorization's own setting: the reconciler reads it (op.h's
 * settings, config_add_settings). */
const struct config_setting authorize_expiry_setting = {
    .name = "RECONCILER_AUTHORIZATION_EXPIRY_MS",
    .def = "604800000",
    .min = 1000,
    .max = 31536000000LL,
    .roles = CONFIG_ROLE_RECONCILER,
    .help = "an authorization held this long is looked at for the provider's expiry",
};

static void *authorize_store_open(const char *url, const char *actor,
                                  const struct reconcile_limits *lim,
                                  const config_t *cfg, struct charged_error *err)
{
    long long expiry_ms = config_setting_int(cfg, &authorize_expiry_setting);
    CHARGED_ASSERT(lim && expiry_ms > 0);
    return attempt_store_new_of(url, actor, "manual", expiry_ms, err);
}

OP_RECONCILE_STORE_HOOKS_OPENED(authorize, authorize_store_open, attempt_store,
                                struct attempt_due, struct attempt_call, attempt_id)

static void authorize_begin(const struct op_look_env *env, const void *row,
                            struct op_look_start *start, struct reconcile_look *core,
                            int64_t claimed_at)
{
    attempt_look_begin(&authorize_look_order, env, row, start, core, claimed_at);
}

/* A hold the provider canceled on its own is published as the
 * authorization's (AUTHORIZE_EXPIRED_EVENT); every other move as its
 * status's. */
static enum charged_rc authorize_settle(void *store, struct op_settlement *s,
                                        struct charged_error *err)
{
    CHARGED_ASSERT(s);
    /* Only the provider's expiry voids a hold here (a void is its step's). */
    CHARGED_ASSERT(s->status != ATTEMPT_STATUS_VOIDED ||
                   s->expected == ATTEMPT_STATUS_AUTHORIZED);
    return attempt_look_settle(
        store, s, s->status == ATTEMPT_STATUS_VOIDED ? AUTHORIZE_EXPIRED_EVENT : NULL,
        err);
}

const struct op_reconcile authorize_reconcile = {
    ATTEMPT_LOOK_FACE,
    OP_RECONCILE_STORE(authorize),
    .begin = authorize_begin,
    .settle = authorize_settle,
};
