#include "attempt_status.h"

#include <pthread.h>
#include <string.h>

#include "charged_assert.h"

#define P  (1u << ATTEMPT_STATUS_PENDING)
#define PR (1u << ATTEMPT_STATUS_PROCESSING)
#define U  (1u << ATTEMPT_STATUS_UNKNOWN)
#define S  (1u << ATTEMPT_STATUS_SUCCEEDED)
#define F  (1u << ATTEMPT_STATUS_FAILED)
#define RJ (1u << ATTEMPT_STATUS_REJECTED)
#define RV (1u << ATTEMPT_STATUS_REQUIRES_REVIEW)
#define AU (1u << ATTEMPT_STATUS_AUTHORIZED)
#define V  (1u << ATTEMPT_STATUS_VOIDED)

static const struct {
    const char *name;
    int live;
    unsigned next;                 /* statuses it may move to */
    const char *event_type;        /* published on entering it */
    const char *refund_event_type; /* a refund's, on entering it */
    const char *auth_event_type;   /* an authorization's own, on entering it */
} statuses[ATTEMPT_STATUS__COUNT] = {
    /* PENDING -> REJECTED: a refund's claim refuses a refund whose charge is
     * not refundable (a charge is refused at its record instead). */
    [ATTEMPT_STATUS_PENDING] = {ATTEMPT_S_PENDING, 1, PR | RJ, NULL, NULL, NULL},
    /* PROCESSING -> PROCESSING: a takeover, or the provider said processing. */
    [ATTEMPT_STATUS_PROCESSING] = {ATTEMPT_S_PROCESSING, 1, PR | U | S | F | RV | AU,
                                   NULL, NULL, NULL},
    [ATTEMPT_STATUS_UNKNOWN] = {ATTEMPT_S_UNKNOWN, 1, PR | S | F | RV | AU,
                                "charge.unknown", "refund.unknown",
                                "authorization.unknown"},
    /* An authorization's SUCCEEDED is its capture's: capture.succeeded. */
    [ATTEMPT_STATUS_SUCCEEDED] = {ATTEMPT_S_SUCCEEDED, 1, RV, "charge.succeeded",
                                  "refund.succeeded", NULL},
    [ATTEMPT_STATUS_FAILED] = {ATTEMPT_S_FAILED, 0, RV, "charge.failed",
                               "refund.failed", "authorization.failed"},
    [ATTEMPT_STATUS_REJECTED] = {ATTEMPT_S_REJECTED, 0, 0, "charge.rejected",
                                 "refund.rejected", "authorization.rejected"},
    [ATTEMPT_STATUS_REQUIRES_REVIEW] = {ATTEMPT_S_REQUIRES_REVIEW, 1, S | F | AU | V,
                                        "charge.requires_review",
                                        "refund.requires_review",
                                        "authorization.requires_review"},
    /* Money held is the order's: live, as SUCCEEDED is. One capture takes it
     * (SUCCEEDED), or a void or its expiry releases it (VOIDED). */
    [ATTEMPT_STATUS_AUTHORIZED] = {ATTEMPT_S_AUTHORIZED, 1, S | V | RV, NULL, NULL,
                                   "authorization.succeeded"},
    /* Released: the order may be paid by another attempt. Its event is the
     * void's (void.succeeded), not the authorization's. */
    [ATTEMPT_STATUS_VOIDED] = {ATTEMPT_S_VOIDED, 0, RV, NULL, NULL, NULL},
};

/* PROCESSING: recorded and claimed by one statement. */
static const unsigned new_attempt = P | PR | RJ;

const char *attempt_status_name(enum attempt_status s)
{
    return (unsigned)s < ATTEMPT_STATUS__COUNT ? statuses[s].name : NULL;
}

const char *attempt_status_event_type(enum attempt_status s)
{
    return (unsigned)s < ATTEMPT_STATUS__COUNT ? statuses[s].event_type : NULL;
}

const char *attempt_status_refund_event_type(enum attempt_status s)
{
    return (unsigned)s < ATTEMPT_STATUS__COUNT ? statuses[s].refund_event_type : NULL;
}

const char *attempt_status_authorization_event_type(enum attempt_status s)
{
    return (unsigned)s < ATTEMPT_STATUS__COUNT ? statuses[s].auth_event_type : NULL;
}

int attempt_status_parse(const char *s)
{
    for (int i = 0; s && i < ATTEMPT_STATUS__COUNT; i++)
        if (!strcmp(s, statuses[i].name))
            return i;
    return -1;
}

int attempt_status_is_live(enum attempt_status s)
{
    return (unsigned)s < ATTEMPT_STATUS__COUNT && statuses[s].live;
}

int attempt_status_is_settled(enum attempt_status s)
{
    return s == ATTEMPT_STATUS_SUCCEEDED || s == ATTEMPT_STATUS_FAILED ||
           s == ATTEMPT_STATUS_REJECTED || s == ATTEMPT_STATUS_REQUIRES_REVIEW ||
           s == ATTEMPT_STATUS_AUTHORIZED || s == ATTEMPT_STATUS_VOIDED;
}

static char live_array[128];
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

static void build_live_array(void)
{
    size_t n = 0;
    live_array[n++] = '{';
    for (int i = 0; i < ATTEMPT_STATUS__COUNT; i++) {
        if (!statuses[i].live)
            continue;
        size_t l = strlen(statuses[i].name);
        /* The names, commas and braces fit: the table is ours. */
        CHARGED_ASSERT(n + 1 + l + 2 <= sizeof(live_array));
        if (n > 1)
            live_array[n++] = ',';
        memcpy(live_array + n, statuses[i].name, l);
        n += l;
    }
    CHARGED_ASSERT(n > 1); /* a live status exists: the array is never "{}" */
    live_array[n++] = '}';
    live_array[n] = '\0';
}

const char *attempt_status_live_array(void)
{
    pthread_once(&live_once, build_live_array);
    return live_array;
}

int attempt_status_transition_allowed(int from, enum attempt_status to)
{
    if ((unsigned)to >= ATTEMPT_STATUS__COUNT || from >= ATTEMPT_STATUS__COUNT)
        return 0;
    unsigned next = from < 0 ? new_attempt : statuses[from].next;
    /* The table names statuses only, and REJECTED is the end of the road. */
    CHARGED_ASSERT((next >> ATTEMPT_STATUS__COUNT) == 0);
    CHARGED_ASSERT(from != ATTEMPT_STATUS_REJECTED || next == 0);
    return (next >> to) & 1u;
}
