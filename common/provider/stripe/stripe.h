/* stripe: the Stripe backend of the provider seam (provider.h), the API
 * psp-sim speaks (PaymentIntents, Refunds, Stripe-Version,
 * Idempotent-Replayed, Stripe-Signature webhooks). Callers use it through
 * provider_client_* and provider_webhook_*; the functions below are the
 * backend's own, for its tests, the fuzz targets and the simulators. */
#ifndef CHARGED_STRIPE_H
#define CHARGED_STRIPE_H

#include <stddef.h>
#include <stdint.h>

#include "provider.h"
#include "webhook_event.h"

extern const struct provider_backend provider_stripe;

/* A Stripe event (data.object a PaymentIntent, a Refund, or a Charge's
 * refunds) into *ev, as provider_backend.parse_event: checks the event's
 * shape and keeps what the decisions need (webhook_event.h has the
 * contract). Text fields are checked, never truncated: a value too long for
 * its field is refused. A success must name its amount (>= 0) and
 * currency. `normalized` (malloc'd, the caller frees) receives the event as
 * jansson re-writes it, ASCII only, card numbers masked: what is stored. */
enum charged_rc stripe_webhook_parse(const char *body, size_t len,
                                     struct webhook_event *ev, char **normalized,
                                     struct charged_error *err);

/* The header Stripe signs its deliveries with. */
#define STRIPE_SIGNATURE_HEADER "Stripe-Signature"

/* Stripe signs "<t>.<raw body>" with HMAC-SHA256 under a shared secret and
 * sends `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>...]`. A delivery is
 * authentic when any v1 value matches the HMAC under any of the secrets
 * (two during a rotation: the new and the old), and fresh when t is within
 * WEBHOOK_SIGNATURE_TOLERANCE_S of now, either way: a replayed old delivery
 * and one dated in the future are both refused. Comparisons are in constant
 * time. Pure: no I/O, now is passed in. `header` NULL reads as missing. */
enum webhook_signature_rc stripe_signature_verify(const char *header, const char *body,
                                                  size_t body_len,
                                                  const char *const *secrets,
                                                  size_t nsecrets, int64_t now_s);

/* Writes the header value Stripe would send for body at time t with one
 * secret ("t=<t>,v1=<hex>"), into out (at least 80 bytes). For tests and
 * the simulator. 0 / -1 when out is too small. */
int stripe_signature_sign(const char *body, size_t body_len, const char *secret,
                          int64_t t, char *out, size_t out_size);

#endif
