#include "stripe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "charged_assert.h"

/* A header never needs more v1 values than this; more is refused, so that
 * a hostile header cannot make us compute thousands of comparisons. */
#define MAX_V1      8
#define MAX_HEADER  1024
#define DIGEST_SIZE 32

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* HMAC-SHA256(secret, "<t>.<body>"). 0 / -1. */
static int digest(const char *secret, const char *t, size_t t_len, const char *body,
                  size_t body_len, unsigned char out[DIGEST_SIZE])
{
    unsigned int len = 0;
    size_t n = t_len + 1 + body_len;
    /* Only asked with a secret to sign under and the t it read or wrote. */
    CHARGED_ASSERT(secret != NULL && t != NULL && t_len > 0);
    CHARGED_ASSERT(body != NULL || body_len == 0);
    unsigned char *msg = malloc(n ? n : 1);
    if (!msg)
        return -1;
    memcpy(msg, t, t_len);
    msg[t_len] = '.';
    if (body_len)
        memcpy(msg + t_len + 1, body, body_len);
    int ok =
        HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, n, out, &len) != NULL &&
        len == DIGEST_SIZE;
    free(msg);
    return ok ? 0 : -1;
}

enum webhook_signature_rc stripe_signature_verify(const char *header, const char *body,
                                                  size_t body_len,
                                                  const char *const *secrets,
                                                  size_t nsecrets, int64_t now_s)
{
    unsigned char v1[MAX_V1][DIGEST_SIZE], want[DIGEST_SIZE];
    const char *t = NULL;
    size_t t_len = 0, nv1 = 0;
    int64_t ts = 0;

    CHARGED_ASSERT(body != NULL || body_len == 0);
    CHARGED_ASSERT(secrets != NULL || nsecrets == 0);
    if (!header || !*header)
        return WEBHOOK_SIGNATURE_MISSING;
    if (strlen(header) > MAX_HEADER)
        return WEBHOOK_SIGNATURE_MALFORMED;
    /* Elements "key=value" separated by ','; unknown keys (v0, later
     * schemes) are skipped, as the provider asks. */
    for (const char *p = header; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq)
            return WEBHOOK_SIGNATURE_MALFORMED;
        size_t klen = (size_t)(eq - p), vlen = len - klen - 1;
        const char *v = eq + 1;
        if (klen == 1 && p[0] == 't') {
            if (t || vlen == 0 || vlen > 12)
                return WEBHOOK_SIGNATURE_MALFORMED;
            ts = 0;
            for (size_t i = 0; i < vlen; i++) {
                if (v[i] < '0' || v[i] > '9')
                    return WEBHOOK_SIGNATURE_MALFORMED;
                ts = ts * 10 + (v[i] - '0');
            }
            t = v;
            t_len = vlen;
        } else if (klen == 2 && p[0] == 'v' && p[1] == '1') {
            if (vlen != 2 * DIGEST_SIZE || nv1 == MAX_V1)
                return WEBHOOK_SIGNATURE_MALFORMED;
            for (size_t i = 0; i < DIGEST_SIZE; i++) {
                int hi = hex_value(v[2 * i]), lo = hex_value(v[2 * i + 1]);
                if (hi < 0 || lo < 0)
                    return WEBHOOK_SIGNATURE_MALFORMED;
                v1[nv1][i] = (unsigned char)(hi << 4 | lo);
            }
            nv1++;
        }
        p = end ? end + 1 : p + len;
    }
    if (!t || nv1 == 0)
        return WEBHOOK_SIGNATURE_MALFORMED;
    CHARGED_ASSERT(t_len > 0 && nv1 <= MAX_V1);
    if (ts < now_s - WEBHOOK_SIGNATURE_TOLERANCE_S)
        return WEBHOOK_SIGNATURE_STALE;
    if (ts > now_s + WEBHOOK_SIGNATURE_TOLERANCE_S)
        return WEBHOOK_SIGNATURE_FUTURE;
    /* Every pair is compared, matched or not, so that timing tells nothing
     * about which secret or value came close. */
    int match = 0;
    for (size_t s = 0; s < nsecrets; s++) {
        if (!secrets[s] || !*secrets[s] ||
            digest(secrets[s], t, t_len, body, body_len, want) != 0)
            continue;
        for (size_t i = 0; i < nv1; i++)
            match |= CRYPTO_memcmp(want, v1[i], DIGEST_SIZE) == 0;
    }
    OPENSSL_cleanse(want, sizeof(want));
    return match ? WEBHOOK_SIGNATURE_OK : WEBHOOK_SIGNATURE_MISMATCH;
}

int stripe_signature_sign(const char *body, size_t body_len, const char *secret,
                          int64_t t, char *out, size_t out_size)
{
    CHARGED_ASSERT(secret != NULL && out != NULL);
    unsigned char d[DIGEST_SIZE];
    char ts[24];
    int n = snprintf(ts, sizeof(ts), "%lld", (long long)t);
    if (out_size < 80 || digest(secret, ts, (size_t)n, body, body_len, d) != 0)
        return -1;
    size_t off = (size_t)snprintf(out, out_size, "t=%s,v1=", ts);
    for (size_t i = 0; i < DIGEST_SIZE; i++)
        off += (size_t)snprintf(out + off, out_size - off, "%02x", d[i]);
    return 0;
}
