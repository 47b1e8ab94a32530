/* Fuzz target: the webhook signature check (common/core/webhook_signature).
 * The input is a mode byte, a time offset byte, the secret, a newline, the
 * header, a newline, then the body. Mode bit 0 replaces the header by the
 * one the provider would send (signed at now + offset), bit 1 then flips one
 * of its bytes.
 *
 * Properties: an accepted delivery has a fresh t and a v1 that is the HMAC
 * of "<t>.<body>" under one of the secrets, computed here independently;
 * a delivery signed with a secret, fresh and untouched, is accepted. */
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "fuzz_check.h"
#include "stripe.h"

#define NOW 1700000000LL

static int hex_nibble(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* 1 if the v1 value at v (64 hex digits) is HMAC(secret, "<t>.<body>"). */
static int v1_matches(const char *v, const char *secret, const char *t, size_t t_len,
                      const uint8_t *body, size_t body_len)
{
    unsigned char want[EVP_MAX_MD_SIZE];
    unsigned int want_len = 0;
    uint8_t *msg = malloc(t_len + 1 + body_len);
    FUZZ_CHECK(msg);
    memcpy(msg, t, t_len);
    msg[t_len] = '.';
    if (body_len)
        memcpy(msg + t_len + 1, body, body_len);
    FUZZ_CHECK(HMAC(EVP_sha256(), secret, (int)strlen(secret), msg,
                    t_len + 1 + body_len, want, &want_len));
    free(msg);
    FUZZ_CHECK(want_len == 32);
    for (unsigned i = 0; i < 32; i++) {
        int hi = hex_nibble(v[2 * i]), lo = hex_nibble(v[2 * i + 1]);
        if (hi < 0 || lo < 0 || (unsigned char)(hi << 4 | lo) != want[i])
            return 0;
    }
    return 1;
}

/* The accepted header, read here again: one t, fresh, and a matching v1. */
static void check_accepted(const char *header, const char *const *secrets,
                           const uint8_t *body, size_t body_len)
{
    const char *t = NULL;
    size_t t_len = 0;
    for (const char *p = header; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 2 && p[0] == 't' && p[1] == '=') {
            FUZZ_CHECK(!t);
            t = p + 2;
            t_len = len - 2;
        }
        p = end ? end + 1 : p + len;
    }
    FUZZ_CHECK(t && t_len >= 1 && t_len <= 12);
    long long ts = 0;
    for (size_t i = 0; i < t_len; i++) {
        FUZZ_CHECK(t[i] >= '0' && t[i] <= '9');
        ts = ts * 10 + (t[i] - '0');
    }
    FUZZ_CHECK(ts >= NOW - WEBHOOK_SIGNATURE_TOLERANCE_S &&
               ts <= NOW + WEBHOOK_SIGNATURE_TOLERANCE_S);
    int matched = 0;
    for (const char *p = header; *p && !matched;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 67 && !strncmp(p, "v1=", 3))
            for (int s = 0; s < 2 && !matched; s++)
                matched = secrets[s][0] &&
                          v1_matches(p + 3, secrets[s], t, t_len, body, body_len);
        p = end ? end + 1 : p + len;
    }
    FUZZ_CHECK(matched);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int mode = data[0];
    int offset = (int8_t)data[1] * 8; /* -1024..1016 s: both sides of the tolerance */
    data += 2;
    size -= 2;
    size_t secret_len, header_len;
    const uint8_t *secret_at = fuzz_next_line(&data, &size, &secret_len);
    const uint8_t *header_at = fuzz_next_line(&data, &size, &header_len);
    char *secret = fuzz_strndup(secret_at, secret_len);
    char *header = fuzz_strndup(header_at, header_len);
    uint8_t *body = fuzz_memdup(data, size);
    const char *secrets[2] = {secret, "whsec_the_old_one"};
    int signed_fresh = 0;

    if ((mode & 1) && secret[0]) {
        free(header);
        header = malloc(128);
        FUZZ_CHECK(header);
        FUZZ_CHECK(stripe_signature_sign((const char *)body, size, secret, NOW + offset,
                                         header, 128) == 0);
        signed_fresh = offset >= -WEBHOOK_SIGNATURE_TOLERANCE_S &&
                       offset <= WEBHOOK_SIGNATURE_TOLERANCE_S;
        if (mode & 2) {
            size_t at = (size_t)(mode >> 2) % strlen(header);
            header[at] = (char)(header[at] ^ 0x01);
            signed_fresh = 0;
        }
    }
    enum webhook_signature_rc rc =
        stripe_signature_verify(header, (const char *)body, size, secrets, 2, NOW);
    FUZZ_CHECK(webhook_signature_error(rc)[0]);
    if (rc == WEBHOOK_SIGNATURE_OK)
        check_accepted(header, secrets, body, size);
    if (signed_fresh)
        FUZZ_CHECK(rc == WEBHOOK_SIGNATURE_OK);
    free(secret);
    free(header);
    free(body);
    return 0;
}
