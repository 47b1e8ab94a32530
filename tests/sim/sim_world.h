/* sim_world: what the simulation's models share: the rules a run may
 * break on purpose (--break), the violations the invariants report, and
 * the simulated clock's settings. Test-only code: nothing of it is
 * production code, and no production module knows of it. */
#ifndef CHARGED_SIM_WORLD_H
#define CHARGED_SIM_WORLD_H

#include <stdint.h>

/* A rule of charged the models can be told to drop, to show that the
 * invariants catch what the rule prevents. */
enum sim_break {
    SIM_BREAK_NONE = 0,
    SIM_BREAK_EPOCH_FENCE = 1 << 0,          /* persist/settle ignore the lease fence */
    SIM_BREAK_KEY_WINDOW = 1 << 1,           /* worker/reconciler skip the key window */
    SIM_BREAK_ONE_LIVE_PER_ORDER = 1 << 2,   /* the store drops the partial index */
    SIM_BREAK_COMMIT_AFTER_DURABLE = 1 << 3, /* offsets committed at fetch */
    SIM_BREAK_REFUND_RESERVATION = 1 << 4,   /* refunds not reserved on the charge */
    SIM_BREAK_KEY_MARGIN = 1 << 5,           /* the key window with no margin */
    SIM_BREAK_LIST_SKIPPED = 1 << 6,         /* never_executed without the list */
    SIM_BREAK_OWNERSHIP = 1 << 7,            /* metadata naming an attempt is proof */
    /* Migration 0016's hold, each rule of it apart (the capture's claim): */
    SIM_BREAK_CAPTURE_HOLD = 1 << 8,     /* a capture holds a captured or held one */
    SIM_BREAK_VOID_HOLD = 1 << 9,        /* a capture holds a voided or void-held one */
    SIM_BREAK_CAPTURE_AMOUNT = 1 << 10,  /* a capture past the authorization is sent */
    SIM_BREAK_REFUND_CAPTURED = 1 << 11, /* refunds bound by the authorized amount */
    SIM_BREAK_PARK = 1 << 12, /* a throttled (or key-in-use) job retries in its slot */
    SIM_BREAK_UNPARK = 1 << 13, /* a parked job never comes back */
    SIM_BREAK_BUDGET = 1 << 14, /* calls sent without asking the budget's gate */
};

/* A step of an authorization's, and a refund: the rows that name an
 * attempt (sim_store's step table holds captures and voids). */
enum sim_step_kind { SIM_STEP_REFUND = 0, SIM_STEP_CAPTURE, SIM_STEP_VOID };

/* The first invariant a run broke: its rule and one line of why. */
struct sim_violation {
    const char *rule; /* NULL: none */
    char detail[256];
};

void sim_violate(struct sim_violation *v, const char *rule, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The deployment's settings, as charged's configuration names them. */
struct sim_settings {
    int64_t key_retention_ms;       /* WORKER_KEY_RETENTION_MS (the provider's too) */
    int64_t provider_timeout_ms;    /* PROVIDER_TIMEOUT_MS */
    int64_t lease_ms;               /* WORKER_LEASE_MS */
    int64_t recheck_ms;             /* a job's wait before claiming again */
    int64_t search_lag_ms;          /* RECONCILER_SEARCH_LAG_MS */
    int64_t provider_search_lag_ms; /* the provider's real lag, at most */
    int64_t stale_ms;               /* RECONCILER_STALE_MS */
    int64_t max_age_ms;             /* RECONCILER_MAX_AGE_MS */
    int64_t commit_interval_ms;
    int64_t batch_hold_ms; /* WORKER_BATCH_HOLD_MS: record and persist gather */
};

#endif
