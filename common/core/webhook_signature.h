/* webhook_signature: is a provider webhook delivery authentic and fresh?
 *
 * The provider signs "<t>.<raw body>" with HMAC-SHA256 under a shared
 * secret and sends `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`.
 * A delivery is authentic when any v1 value matches the HMAC under any of
 * the configured secrets (two during a rotation: the new and the old), and
 * fresh when t is within WEBHOOK_SIGNATURE_TOLERANCE_S of now, either way:
 * a replayed old delivery and one dated in the future are both refused.
 * Comparisons are in constant time. Pure: no I/O, now is passed in. */
#ifndef CHARGED_WEBHOOK_SIGNATURE_H
#define CHARGED_WEBHOOK_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#define WEBHOOK_SIGNATURE_TOLERANCE_S 300

/* Why a delivery was refused; 0 is success. */
enum webhook_signature_rc {
    WEBHOOK_SIGNATURE_OK = 0,
    WEBHOOK_SIGNATURE_MISSING,   /* no header, or empty */
    WEBHOOK_SIGNATURE_MALFORMED, /* not t=<digits>,v1=<64 hex>... */
    WEBHOOK_SIGNATURE_STALE,     /* t more than the tolerance in the past */
    WEBHOOK_SIGNATURE_FUTURE,    /* t more than the tolerance ahead */
    WEBHOOK_SIGNATURE_MISMATCH,  /* no v1 matches any secret */
};

/* A short lowercase phrase for rc, safe to answer to anyone. */
const char *webhook_signature_error(enum webhook_signature_rc rc);

/* Checks `header` (NULL reads as missing) for the `body_len` bytes at body
 * against the `nsecrets` secrets, at unix time now_s. */
enum webhook_signature_rc webhook_signature_verify(const char *header, const char *body,
                                                   size_t body_len,
                                                   const char *const *secrets,
                                                   size_t nsecrets, int64_t now_s);

/* Writes the header value a provider would send for body at time t with one
 * secret ("t=<t>,v1=<hex>"), into out (at least 80 bytes). For tests and the
 * simulator. 0 / -1 when out is too small. */
int webhook_signature_sign(const char *body, size_t body_len, const char *secret,
                           int64_t t, char *out, size_t out_size);

#endif
