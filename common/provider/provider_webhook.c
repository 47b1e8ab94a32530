/* provider_webhook: the seam's webhook face (provider.h). Pure, like the
 * parsers behind it: the api calls it with the backend it chose, and the
 * unit tests and fuzz targets of the parsers link it without libcurl. */
#include <stddef.h>
#include <stdint.h>

#include "charged_assert.h"
#include "provider.h"

const char *webhook_signature_error(enum webhook_signature_rc rc)
{
    switch (rc) {
    case WEBHOOK_SIGNATURE_OK:
        return "ok";
    case WEBHOOK_SIGNATURE_MISSING:
        return "missing signature";
    case WEBHOOK_SIGNATURE_MALFORMED:
        return "malformed signature header";
    case WEBHOOK_SIGNATURE_STALE:
        return "signature timestamp too old";
    case WEBHOOK_SIGNATURE_FUTURE:
        return "signature timestamp in the future";
    case WEBHOOK_SIGNATURE_MISMATCH:
        return "signature does not match";
    }
    return "bad signature";
}

enum webhook_signature_rc provider_webhook_verify(const struct provider_backend *be,
                                                  const char *header, const char *body,
                                                  size_t body_len,
                                                  const char *const *secrets,
                                                  size_t nsecrets, int64_t now_s)
{
    CHARGED_ASSERT(be != NULL && be->verify != NULL);
    CHARGED_ASSERT(body != NULL || body_len == 0);
    CHARGED_ASSERT(secrets != NULL || nsecrets == 0);
    return be->verify(header, body, body_len, secrets, nsecrets, now_s);
}

enum charged_rc provider_webhook_parse(const struct provider_backend *be,
                                       const char *body, size_t len,
                                       struct webhook_event *ev, char **normalized,
                                       struct charged_error *err)
{
    CHARGED_ASSERT(be != NULL && be->parse_event != NULL);
    CHARGED_ASSERT(body != NULL && ev != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = be->parse_event(body, len, ev, normalized, err);
    CHARGED_ASSERT(rc == CHARGED_OK || rc == CHARGED_BAD_ITEM || rc == CHARGED_RETRY);
    return rc;
}
