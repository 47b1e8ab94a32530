/* console_store: the operator console's own tables: its access tokens (kept
 * as SHA-256 hashes only), the sessions signed in with them, and the log of
 * every action taken through it (migrations/0010_console.sql).
 *
 * A token is "cct_" and 43 characters of base64url (256 random bits), shown
 * once when it is made. A session lives in the database, not in a console
 * process, so that any replica answers it and a revoked token is refused by
 * the very next request: every look-up joins the token and checks that it
 * is not revoked and that the session has not expired. Every call returns
 * an enum charged_rc (store.h) with err; the connection is opened lazily and
 * again after it broke, as every store's. */
#ifndef CHARGED_CONSOLE_STORE_H
#define CHARGED_CONSOLE_STORE_H

#include <stddef.h>

#include <jansson.h>

#include "store.h"

#define CONSOLE_TOKEN_MAX_NAME 128
/* "cct_" + 43 base64url characters + NUL */
#define CONSOLE_SECRET_SIZE 48

typedef struct console_store console_store_t;

enum console_role { CONSOLE_ROLE_VIEWER = 0, CONSOLE_ROLE_OPERATOR };

/* "viewer" / "operator"; the role a name names, or -1. */
const char *console_role_name(enum console_role r);
int console_role_parse(const char *s);

/* Who a session belongs to. */
struct console_who {
    char name[CONSOLE_TOKEN_MAX_NAME + 1]; /* the token's name: the actor */
    enum console_role role;
    char csrf[CONSOLE_SECRET_SIZE]; /* the session's CSRF token */
};

/* 1 if name may name a token: 1..CONSOLE_TOKEN_MAX_NAME of ASCII letters,
 * digits, '.', '_', '-' and '@'. A token's name is the actor of everything
 * done with it: no two may look alike, and none may hide a line break or a
 * terminal's control sequence in the records. */
int console_store_name_ok(const char *name);

console_store_t *console_store_new(const char *database_url, struct charged_error *err);
void console_store_free(console_store_t *st);

/* ---- tokens (chargectl console token add|list|revoke) ---- */

/* Makes a token named `name` (1..CONSOLE_TOKEN_MAX_NAME bytes of UTF-8 on
 * one line, unique among tokens not revoked) with `role`; its secret, in
 * secret_out, exists nowhere else afterwards. CHARGED_BAD_ITEM when the name is
 * taken or bad (err says which). The action is logged with actor `by`. */
enum charged_rc console_store_token_add(console_store_t *st, const char *name,
                                        enum console_role role, const char *by,
                                        char secret_out[CONSOLE_SECRET_SIZE],
                                        struct charged_error *err);

/* Every token, newest first: [{name, role, created_by, created_at,
 * last_used_at, revoked_at}] (times RFC 3339 UTC; null when not). */
enum charged_rc console_store_token_list(console_store_t *st, json_t **out,
                                         struct charged_error *err);

/* Revokes the live token `name` and ends its sessions, in one statement.
 * CHARGED_NOT_FOUND when no live token has that name. Logged with actor `by`. */
enum charged_rc console_store_token_revoke(console_store_t *st, const char *name,
                                           const char *by, struct charged_error *err);

/* ---- sessions ---- */

/* Signs in with a token's secret: a new session of ttl_s seconds, its id in
 * session_out (for the cookie) and *who filled. CHARGED_NOT_FOUND when the
 * secret names no live token (also when it is malformed). Expired sessions
 * are removed on the way. */
enum charged_rc console_store_login(console_store_t *st, const char *secret,
                                    long long ttl_s,
                                    char session_out[CONSOLE_SECRET_SIZE],
                                    struct console_who *who, struct charged_error *err);

/* The session a cookie names: CHARGED_OK and *who, or CHARGED_NOT_FOUND when it
 * is unknown, expired, or its token was revoked. */
enum charged_rc console_store_session(console_store_t *st, const char *session,
                                      struct console_who *who,
                                      struct charged_error *err);

/* Ends a session (signing out). CHARGED_OK also when there was none. */
enum charged_rc console_store_logout(console_store_t *st, const char *session,
                                     struct charged_error *err);

/* ---- the action log ---- */

/* Records one action: who (the token's name, or the OS user of chargectl),
 * what ("login", "resolve", "replay", "token_add", ...), on what (an attempt
 * id, a letter's position; NULL), how it ended ("ok", "refused",
 * "conflict", ...) and detail_json (an object; NULL: {}). */
enum charged_rc console_store_record(console_store_t *st, const char *actor,
                                     const char *action, const char *target,
                                     const char *outcome, const char *detail_json,
                                     struct charged_error *err);

/* The newest `limit` actions, newest first: [{at, actor, action, target,
 * outcome, detail}]. */
enum charged_rc console_store_actions(console_store_t *st, long long limit,
                                      json_t **out, struct charged_error *err);

/* ---- the overview's counts ---- */

/* {"attempts_by_status": {STATUS: n, ...}} for every status with attempts.
 * One statement. */
enum charged_rc console_store_status_counts(console_store_t *st, json_t **out,
                                            struct charged_error *err);

#endif
