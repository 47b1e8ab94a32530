#include "console_store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "store_conn.h"
#include "utf8_text.h"

/* The console's statements touch a row or a few; a sign-in waits this long
 * at most behind a revocation of its token, then the request fails. */
#define CONSOLE_LOCK_TIMEOUT "2s"

#define TOKEN_PREFIX   "cct_"
#define SESSION_PREFIX "ccs_"
#define SECRET_BYTES   32
/* base64url of SECRET_BYTES, without padding */
#define SECRET_CHARS 43
/* The action log lists at most this many at once. */
#define ACTIONS_MAX 10000

struct console_store {
    store_conn_t *db;
};

#define TS(col)                                                                        \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* clang-format off */
/* The token and its action in one statement: a name already taken by a
 * live token (console_tokens_live_name) fails both. */
static const char *SQL_TOKEN_ADD =
    "WITH t AS ("
    "  INSERT INTO console_tokens (name, role, token_sha256, created_by)"
    "  VALUES ($1, $2, $3, $4) RETURNING name, role)"
    " INSERT INTO console_actions (actor, action, target, outcome, detail)"
    " SELECT $4, 'token_add', t.name, 'ok', jsonb_build_object('role', t.role) FROM t"
    " RETURNING id";

static const char *SQL_TOKEN_LIST =
    "SELECT coalesce(json_agg(json_build_object('name', name, 'role', role,"
    "  'created_by', created_by, 'created_at', " TS("created_at") ","
    "  'last_used_at', " TS("last_used_at") ", 'revoked_at', " TS("revoked_at") ")"
    "  ORDER BY created_at DESC, id DESC), '[]')::text"
    " FROM console_tokens";

/* A sign-in racing the revocation waits for the token's row and then finds
 * it revoked; a session it inserted just before is refused by every
 * look-up (they join the token) and removed once it expired. */
static const char *SQL_TOKEN_REVOKE =
    "WITH t AS ("
    "  UPDATE console_tokens SET revoked_at = now()"
    "  WHERE name = $1 AND revoked_at IS NULL RETURNING id, name),"
    " s AS (DELETE FROM console_sessions s USING t WHERE s.token_id = t.id RETURNING 1),"
    " a AS ("
    "  INSERT INTO console_actions (actor, action, target, outcome, detail)"
    "  SELECT $2, 'token_revoke', t.name, 'ok',"
    "    jsonb_build_object('sessions_ended', (SELECT count(*) FROM s)) FROM t)"
    " SELECT count(*) FROM t";

/* A refusal is logged too: who tried what, and why not. */
static const char *SQL_REFUSED =
    "INSERT INTO console_actions (actor, action, target, outcome, detail)"
    " VALUES ($1, $2, $3, $4, jsonb_build_object('why', $5::text))";

/* Expired sessions go, the token's last use is stamped and the session
 * made, in one statement: the UPDATE locks the token's row, so a
 * revocation committed meanwhile is seen and nothing is made. */
static const char *SQL_LOGIN =
    "WITH gone AS (DELETE FROM console_sessions WHERE expires_at <= now()),"
    " t AS ("
    "  UPDATE console_tokens SET last_used_at = now()"
    "  WHERE token_sha256 = $1 AND revoked_at IS NULL RETURNING id, name, role),"
    " s AS ("
    "  INSERT INTO console_sessions (session_sha256, token_id, csrf_token, expires_at)"
    "  SELECT $2, t.id, $3, now() + make_interval(secs => $4::double precision) FROM t"
    "  RETURNING token_id)"
    " SELECT t.name, t.role FROM t JOIN s ON s.token_id = t.id";

static const char *SQL_SESSION =
    "SELECT t.name, t.role, s.csrf_token"
    " FROM console_sessions s JOIN console_tokens t ON t.id = s.token_id"
    " WHERE s.session_sha256 = $1 AND s.expires_at > now() AND t.revoked_at IS NULL";

static const char *SQL_LOGOUT = "DELETE FROM console_sessions WHERE session_sha256 = $1";

static const char *SQL_RECORD =
    "INSERT INTO console_actions (actor, action, target, outcome, detail)"
    " VALUES ($1, $2, $3, $4, coalesce($5::jsonb, '{}'))";

static const char *SQL_ACTIONS =
    "SELECT coalesce(json_agg(json_build_object('at', " TS("at") ", 'actor', actor,"
    "  'action', action, 'target', target, 'outcome', outcome, 'detail', detail)"
    "  ORDER BY id DESC), '[]')::text"
    " FROM (SELECT * FROM console_actions ORDER BY id DESC LIMIT $1::bigint) a";

static const char *SQL_STATUS_COUNTS =
    "SELECT json_build_object('attempts_by_status',"
    "  coalesce(json_object_agg(status, n), '{}'::json))::text"
    " FROM (SELECT status, count(*) AS n FROM payment_attempts GROUP BY status) c";
/* clang-format on */

const char *console_role_name(enum console_role r)
{
    switch (r) {
    case CONSOLE_ROLE_VIEWER:
        return "viewer";
    case CONSOLE_ROLE_OPERATOR:
        return "operator";
    }
    return NULL;
}

int console_role_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcmp(s, "viewer"))
        return CONSOLE_ROLE_VIEWER;
    if (!strcmp(s, "operator"))
        return CONSOLE_ROLE_OPERATOR;
    return -1;
}

int console_store_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > CONSOLE_TOKEN_MAX_NAME)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("._-@", name[i]))
            return 0;
    return 1;
}

console_store_t *console_store_new(const char *database_url, struct charged_error *err)
{
    console_store_t *st = calloc(1, sizeof(*st));
    if (!st) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    if (!(st->db = store_conn_new(database_url, CONSOLE_LOCK_TIMEOUT, err))) {
        free(st);
        return NULL;
    }
    return st;
}

void console_store_free(console_store_t *st)
{
    if (!st)
        return;
    store_conn_free(st->db);
    free(st);
}

/* One statement of a call, on a session opened if need be; a session the
 * server closed while idle is replaced and the statement asked once more,
 * as every store's. */
static enum charged_rc run(console_store_t *st, const char *sql, int n,
                           const char *const *p, PGresult **res,
                           struct charged_error *err)
{
    enum charged_rc rc;
    if (res)
        *res = NULL;
    if ((rc = store_conn_open(st->db, NULL, err)) != CHARGED_OK)
        return rc;
    rc = store_conn_exec(st->db, sql, n, p, res, err);
    if (rc != CHARGED_OK && store_conn_broken(st->db) &&
        store_conn_open(st->db, NULL, err) == CHARGED_OK)
        rc = store_conn_exec(st->db, sql, n, p, res, err);
    return rc;
}

/* A one-row, one-column JSON answer as a new reference in *out. */
static enum charged_rc run_json(console_store_t *st, const char *sql, int n,
                                const char *const *p, json_t **out,
                                struct charged_error *err)
{
    PGresult *r = NULL;
    enum charged_rc rc;
    *out = NULL;
    charged_error_clear(err);
    if ((rc = run(st, sql, n, p, &r, err)) != CHARGED_OK)
        goto out;
    if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0) ||
        !(*out = json_loads(PQgetvalue(r, 0, 0), 0, NULL))) {
        /* Built by our own SQL: only memory can be missing. */
        charged_error_set(err, "console store: unreadable answer (out of memory?)");
        rc = CHARGED_RETRY;
    }
out:
    PQclear(r);
    return rc;
}

/* base64url without padding of n bytes into out (4 * n / 3 rounded up,
 * plus the NUL). */
static void base64url(const unsigned char *in, size_t n, char *out)
{
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        out[o++] = abc[(v >> 18) & 63];
        out[o++] = abc[(v >> 12) & 63];
        if (i + 1 < n)
            out[o++] = abc[(v >> 6) & 63];
        if (i + 2 < n)
            out[o++] = abc[v & 63];
    }
    out[o] = '\0';
}

/* prefix and SECRET_CHARS of base64url of fresh random bytes into out
 * (CONSOLE_SECRET_SIZE). 0 / -1 when the generator fails. */
static int new_secret(const char *prefix, char out[CONSOLE_SECRET_SIZE])
{
    unsigned char raw[SECRET_BYTES];
    size_t pn = strlen(prefix);
    int rc = -1;
    if (RAND_bytes(raw, sizeof(raw)) != 1)
        goto out;
    memcpy(out, prefix, pn);
    base64url(raw, sizeof(raw), out + pn);
    rc = 0;
out:
    OPENSSL_cleanse(raw, sizeof(raw));
    return rc;
}

/* Whether s is prefix and SECRET_CHARS of base64url, as new_secret makes:
 * anything else is no token and no session, and never reaches SQL. */
static int good_secret(const char *s, const char *prefix)
{
    size_t pn = strlen(prefix);
    if (!s || strncmp(s, prefix, pn) != 0)
        return 0;
    s += pn;
    size_t n = strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                         "0123456789-_");
    return n == SECRET_CHARS && s[n] == '\0';
}

/* The SHA-256 of s, in hex: what the tables keep of a secret. 0 / -1. */
static int sha256_hex(const char *s, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(s, strlen(s), md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32)
        return -1;
    for (unsigned i = 0; i < mdlen; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* Logs a refused change; its own failure is not the caller's: the refusal
 * is what the caller reports. */
static void record_refused(console_store_t *st, const char *by, const char *action,
                           const char *target, const char *outcome, const char *why)
{
    struct charged_error ignore;
    const char *p[5] = {by, action, target, outcome, why};
    run(st, SQL_REFUSED, 5, p, NULL, &ignore);
}

/* The name, role and CSRF token of a row into *who. */
static void fill_who(PGresult *r, int csrf_col, struct console_who *who)
{
    memset(who, 0, sizeof(*who));
    snprintf(who->name, sizeof(who->name), "%s", PQgetvalue(r, 0, 0));
    int role = console_role_parse(PQgetvalue(r, 0, 1));
    /* The table's check allows these two only. */
    who->role = role < 0 ? CONSOLE_ROLE_VIEWER : (enum console_role)role;
    if (csrf_col >= 0)
        snprintf(who->csrf, sizeof(who->csrf), "%s", PQgetvalue(r, 0, csrf_col));
}

enum charged_rc console_store_token_add(console_store_t *st, const char *name,
                                        enum console_role role, const char *by,
                                        char secret_out[CONSOLE_SECRET_SIZE],
                                        struct charged_error *err)
{
    char hash[65];
    const char *role_name = console_role_name(role);
    enum charged_rc rc = CHARGED_BAD_ITEM;

    charged_error_clear(err);
    secret_out[0] = '\0';
    if (!console_store_name_ok(name)) {
        charged_error_set(
            err,
            "a token's name is 1..%d ASCII letters, digits, '.', '_', '-' "
            "and '@'",
            CONSOLE_TOKEN_MAX_NAME);
        goto out;
    }
    if (!role_name) {
        charged_error_set(err, "no such role %d", (int)role);
        goto out;
    }
    if (!utf8_text_line(by, CONSOLE_TOKEN_MAX_NAME)) {
        charged_error_set(err, "the actor is 1..%d bytes of UTF-8 on one line",
                          CONSOLE_TOKEN_MAX_NAME);
        goto out;
    }
    if (new_secret(TOKEN_PREFIX, secret_out) != 0 ||
        sha256_hex(secret_out, hash) != 0) {
        charged_error_set(err, "no random bytes for a token's secret");
        rc = CHARGED_RETRY;
        goto out;
    }
    const char *p[4] = {name, role_name, hash, by};
    if ((rc = run(st, SQL_TOKEN_ADD, 4, p, NULL, err)) == CHARGED_OK)
        return CHARGED_OK;
    /* 23505: the live name's index (the hash's, of 256 random bits, never). */
    if (!strcmp(err->code, "23505")) {
        charged_error_set(err, "a live token is named '%s' already (revoke it first)",
                          name);
        snprintf(err->code, sizeof(err->code), "23505");
        record_refused(st, by, "token_add", name, "refused", "name taken");
    }
out:
    /* A token that was not made has no secret. */
    OPENSSL_cleanse(secret_out, CONSOLE_SECRET_SIZE);
    secret_out[0] = '\0';
    return rc;
}

enum charged_rc console_store_token_list(console_store_t *st, json_t **out,
                                         struct charged_error *err)
{
    return run_json(st, SQL_TOKEN_LIST, 0, NULL, out, err);
}

enum charged_rc console_store_token_revoke(console_store_t *st, const char *name,
                                           const char *by, struct charged_error *err)
{
    PGresult *r = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    if (!utf8_text_line(by, CONSOLE_TOKEN_MAX_NAME)) {
        charged_error_set(err, "the actor is 1..%d bytes of UTF-8 on one line",
                          CONSOLE_TOKEN_MAX_NAME);
        return CHARGED_BAD_ITEM;
    }
    /* No such name can be live: no statement for it. */
    if (!utf8_text_line(name, CONSOLE_TOKEN_MAX_NAME)) {
        charged_error_set(err, "no live token is named so");
        return CHARGED_NOT_FOUND;
    }
    const char *p[2] = {name, by};
    if ((rc = run(st, SQL_TOKEN_REVOKE, 2, p, &r, err)) != CHARGED_OK)
        goto out;
    if (strcmp(PQgetvalue(r, 0, 0), "1") != 0) {
        charged_error_set(err, "no live token is named '%s'", name);
        record_refused(st, by, "token_revoke", name, "not_found", "no live token");
        rc = CHARGED_NOT_FOUND;
    }
out:
    PQclear(r);
    return rc;
}

enum charged_rc console_store_login(console_store_t *st, const char *secret,
                                    long long ttl_s,
                                    char session_out[CONSOLE_SECRET_SIZE],
                                    struct console_who *who, struct charged_error *err)
{
    char token_hash[65], session_hash[65], csrf[CONSOLE_SECRET_SIZE], ttl[32];
    PGresult *r = NULL;
    enum charged_rc rc = CHARGED_NOT_FOUND;

    charged_error_clear(err);
    session_out[0] = '\0';
    csrf[0] = '\0';
    memset(who, 0, sizeof(*who));
    if (ttl_s < 1 || ttl_s > 366LL * 86400) {
        charged_error_set(err, "a session lives 1 s .. 366 days, not %lld s", ttl_s);
        rc = CHARGED_BAD_ITEM;
        goto out;
    }
    if (!good_secret(secret, TOKEN_PREFIX)) {
        charged_error_set(err, "no such token");
        goto out;
    }
    if (sha256_hex(secret, token_hash) != 0 ||
        new_secret(SESSION_PREFIX, session_out) != 0 ||
        sha256_hex(session_out, session_hash) != 0 || new_secret("", csrf) != 0) {
        charged_error_set(err, "no random bytes for a session");
        rc = CHARGED_RETRY;
        goto out;
    }
    snprintf(ttl, sizeof(ttl), "%lld", ttl_s);
    const char *p[4] = {token_hash, session_hash, csrf, ttl};
    if ((rc = run(st, SQL_LOGIN, 4, p, &r, err)) != CHARGED_OK)
        goto out;
    if (PQntuples(r) != 1) {
        charged_error_set(err, "no such token");
        rc = CHARGED_NOT_FOUND;
        goto out;
    }
    fill_who(r, -1, who);
    memcpy(who->csrf, csrf, sizeof(who->csrf));
out:
    PQclear(r);
    OPENSSL_cleanse(csrf, sizeof(csrf));
    if (rc != CHARGED_OK) {
        /* A session that was not made has no id. */
        OPENSSL_cleanse(session_out, CONSOLE_SECRET_SIZE);
        session_out[0] = '\0';
    }
    return rc;
}

enum charged_rc console_store_session(console_store_t *st, const char *session,
                                      struct console_who *who,
                                      struct charged_error *err)
{
    char hash[65];
    PGresult *r = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    memset(who, 0, sizeof(*who));
    if (!good_secret(session, SESSION_PREFIX) || sha256_hex(session, hash) != 0) {
        charged_error_set(err, "no such session");
        return CHARGED_NOT_FOUND;
    }
    const char *p[1] = {hash};
    if ((rc = run(st, SQL_SESSION, 1, p, &r, err)) != CHARGED_OK)
        goto out;
    if (PQntuples(r) != 1) {
        charged_error_set(err, "no such session");
        rc = CHARGED_NOT_FOUND;
        goto out;
    }
    fill_who(r, 2, who);
out:
    PQclear(r);
    return rc;
}

enum charged_rc console_store_logout(console_store_t *st, const char *session,
                                     struct charged_error *err)
{
    char hash[65];
    charged_error_clear(err);
    /* Malformed: no such session, so none to end. */
    if (!good_secret(session, SESSION_PREFIX) || sha256_hex(session, hash) != 0)
        return CHARGED_OK;
    const char *p[1] = {hash};
    return run(st, SQL_LOGOUT, 1, p, NULL, err);
}

enum charged_rc console_store_record(console_store_t *st, const char *actor,
                                     const char *action, const char *target,
                                     const char *outcome, const char *detail_json,
                                     struct charged_error *err)
{
    charged_error_clear(err);
    if (!actor || !*actor || !action || !*action || !outcome || !*outcome) {
        charged_error_set(err, "an action needs an actor, a name and an outcome");
        return CHARGED_BAD_ITEM;
    }
    /* Invalid UTF-8 or JSON, or a detail that is no object, is refused by
     * the database: CHARGED_BAD_ITEM. */
    const char *p[5] = {actor, action, target, outcome, detail_json};
    return run(st, SQL_RECORD, 5, p, NULL, err);
}

enum charged_rc console_store_actions(console_store_t *st, long long limit,
                                      json_t **out, struct charged_error *err)
{
    char n[32];
    *out = NULL;
    charged_error_clear(err);
    if (limit < 1 || limit > ACTIONS_MAX) {
        charged_error_set(err, "list 1..%d actions, not %lld", ACTIONS_MAX, limit);
        return CHARGED_BAD_ITEM;
    }
    snprintf(n, sizeof(n), "%lld", limit);
    const char *p[1] = {n};
    return run_json(st, SQL_ACTIONS, 1, p, out, err);
}

enum charged_rc console_store_status_counts(console_store_t *st, json_t **out,
                                            struct charged_error *err)
{
    return run_json(st, SQL_STATUS_COUNTS, 0, NULL, out, err);
}
