/* psp_limits: psp-sim's Stripe-like rate limiter.
 *
 * Token buckets per API key: one for every request of the key (global) and
 * one per endpoint class. A request takes a token from both its key's
 * global bucket and its class's bucket, or from neither (then it is
 * throttled). Each bucket has a rate (requests/s; 0: unlimited) and a burst
 * (its capacity; 0: the rate, one second's worth). Tokens are counted in
 * thousandths, so the arithmetic is exact in integers. The clock is the
 * caller's (psp-sim's monotonic one), in ms. Also counts what it throttled
 * by class, and a per-second series of served and throttled requests over
 * the last PSP_LIMITS_SERIES_S seconds. Thread-safe (one mutex). */
#ifndef PSP_LIMITS_H
#define PSP_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* The endpoint classes, as users name them (docs/provider.md). */
enum psp_limit_class {
    PSP_LC_CREATE,   /* POST /v1/payment_intents */
    PSP_LC_CAPTURE,  /* POST /v1/payment_intents/<id>/capture and /cancel */
    PSP_LC_REFUND,   /* POST /v1/refunds */
    PSP_LC_RETRIEVE, /* GET /v1/payment_intents/<id>, GET /v1/refunds/<id> */
    PSP_LC_SEARCH,   /* GET /v1/payment_intents/search */
    PSP_LC_LIST,     /* GET /v1/payment_intents, GET /v1/refunds */
    PSP_LC__COUNT
};

#define PSP_LIMITS_RATE_MAX 1000000L
#define PSP_LIMITS_SERIES_S 600

struct psp_limit {
    long rate;  /* requests/s, 0: unlimited */
    long burst; /* capacity in requests, 0: the rate */
};

struct psp_limits_config {
    struct psp_limit global;
    struct psp_limit classes[PSP_LC__COUNT];
    int retry_after; /* send Retry-After (seconds) with a 429 */
};

typedef struct psp_limits psp_limits_t;

/* Buckets for keys 0..nkeys-1 (nkeys > 0), no limit set. */
psp_limits_t *psp_limits_new(size_t nkeys);
void psp_limits_free(psp_limits_t *l);

/* "create", ...; and back (-1 when unknown). */
const char *psp_limits_class_name(enum psp_limit_class c);
int psp_limits_class_parse(const char *name);

/* "N" or "N:BURST" into out: 0, or -1 with errbuf. */
int psp_limits_parse_spec(const char *s, struct psp_limit *out, char *errbuf,
                          size_t errbuf_size);
/* The whole configuration from PUT /rate-limits' JSON (absent: unlimited,
 * retry_after false): 0, or -1 with errbuf and out untouched. */
int psp_limits_config_from_json(json_t *j, struct psp_limits_config *out, char *errbuf,
                                size_t errbuf_size);

/* Replaces the configuration at now_ms, at once: a bucket keeps the tokens
 * it had (at most its new burst); one that was unlimited starts full. */
void psp_limits_set(psp_limits_t *l, const struct psp_limits_config *cfg,
                    int64_t now_ms);
void psp_limits_get(psp_limits_t *l, struct psp_limits_config *out);

/* Takes a token for one request of key in class c at now_ms: 1, or 0 when
 * throttled (counted), with *retry_after_s the seconds until both buckets
 * hold a token again when Retry-After is on (>= 1), else 0. */
int psp_limits_take(psp_limits_t *l, size_t key, enum psp_limit_class c, int64_t now_ms,
                    long *retry_after_s);

/* What was throttled, by class (new reference). */
json_t *psp_limits_throttled_json(psp_limits_t *l);
/* GET /rate-limits: the configuration, the throttled counts and the
 * per-second series, each second stamped in unix seconds from wall_ms
 * (new reference). */
json_t *psp_limits_json(psp_limits_t *l, int64_t now_ms, int64_t wall_ms);
/* Counts, series and buckets as new (full); the configuration stays. */
void psp_limits_reset(psp_limits_t *l, int64_t now_ms);

/* Stripe's 429 body: {"error": {"type": "invalid_request_error", "code":
 * "rate_limit", ...}} (new reference). */
json_t *psp_limits_error_json(void);

#endif
