/* console_input: what a request to the operator console says, checked
 * before anything acts on it: its route, its JSON body, its query
 * parameters and its session cookie. Pure (no I/O), so that it is fuzzed
 * alone: every input either parses into a value the console can act on
 * (CHARGED_OK) or is refused for good, CHARGED_BAD_ITEM with one line in
 * err, which the console answers with a 4xx.
 *
 * JSON bodies are objects of known members only: an unknown member is
 * refused rather than ignored, so that a misspelt "force" never passes for
 * a decision without it. */
#ifndef CHARGED_CONSOLE_INPUT_H
#define CHARGED_CONSOLE_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "charged_error.h"
#include "provider_outcome.h"

#define CONSOLE_PREFIX        "/console"
#define CONSOLE_COOKIE        "charged_console"
#define CONSOLE_MAX_BODY      65536
#define CONSOLE_MAX_POSITIONS 500
#define CONSOLE_MAX_REASON    1000
#define CONSOLE_SECRET_MAX    64 /* a token or session id, NUL included */

enum console_route {
    CONSOLE_R_NONE = 0, /* 404 */
    CONSOLE_R_ASSET,    /* GET: a page asset (id: its name) */
    CONSOLE_R_LOGIN,    /* POST */
    CONSOLE_R_LOGOUT,   /* POST */
    CONSOLE_R_SESSION,  /* GET */
    CONSOLE_R_OVERVIEW, /* GET */
    CONSOLE_R_REVIEWS,  /* GET */
    CONSOLE_R_FIND,     /* GET ?id=: attempts an attempt, order or intent id names */
    CONSOLE_R_ATTEMPT,  /* GET: one attempt's story (id: its UUID) */
    CONSOLE_R_RESOLVE,  /* POST: settle a review (id: the attempt's UUID) */
    CONSOLE_R_LETTERS,  /* GET: dead letters, filtered */
    CONSOLE_R_LETTER,   /* GET: one letter (id: PARTITION:OFFSET) */
    CONSOLE_R_REPLAY,   /* POST: replay letters, or preview it */
    CONSOLE_R_ACTIONS,  /* GET: the action log */
    CONSOLE_R_STEP_RESOLVE, /* POST: settle the review of an operation's
                               record (kind: its noun, id: its UUID) */
    CONSOLE_R_LIMITS,       /* GET: the provider budget, its members' shares */
    CONSOLE_R_LIMITS_SET,   /* POST: change the provider budget */
};

struct console_route_match {
    enum console_route route;
    const char *method; /* the one method it takes: "GET" or "POST" */
    char id[64];        /* asset name, attempt UUID (lower case), position */
    char kind[16];      /* STEP_RESOLVE: one of the route's kinds */
};

/* Matches a path (without its query string). Returns the route, with *m
 * filled; CONSOLE_R_NONE for a path of no route or with a malformed id.
 * kinds: the kinds a step's review may name (NULL-ended: the operations'
 * reviews' nouns). */
enum console_route console_input_route(const char *path, const char *const *kinds,
                                       struct console_route_match *m);

/* 1 when a route changes something (POST): it needs an operator... */
int console_input_route_writes(enum console_route r);

/* {"token": "cct_..."}. */
enum charged_rc console_input_login(const char *body, size_t len,
                                    char secret[CONSOLE_SECRET_MAX],
                                    struct charged_error *err);

struct console_resolve_input {
    int failed;                          /* "decision": "failed"; else "succeeded" */
    char intent_id[PROVIDER_ID_MAX];     /* "payment_intent_id", with succeeded */
    char reason[CONSOLE_MAX_REASON + 1]; /* "reason": required with failed */
    int force;                           /* "force": true */
    char confirm[64];                    /* "confirm": the attempt id, with force */
};

/* {"decision": "succeeded"|"failed", "payment_intent_id": "<provider id>",
 *  "reason": "...", "force": bool, "confirm": "<attempt id>"}: force needs
 * confirm to repeat the attempt id the path names (attempt_id). */
enum charged_rc console_input_resolve(const char *body, size_t len,
                                      const char *attempt_id,
                                      struct console_resolve_input *out,
                                      struct charged_error *err);

/* A capture's, a void's or an authorization's decision: {"decision":
 * "succeeded"|"failed"|"authorized"|"voided", "reason": "..." (required),
 * "force": bool, "confirm": "<id>"}; force needs confirm to repeat the id
 * the path names. Which decisions a kind takes is its review's to say. */
struct console_step_resolve_input {
    char decision[16]; /* the status named, upper case: "SUCCEEDED", ... */
    char reason[CONSOLE_MAX_REASON + 1];
    int force;
    char confirm[64];
};

enum charged_rc console_input_step_resolve(const char *body, size_t len, const char *id,
                                           struct console_step_resolve_input *out,
                                           struct charged_error *err);

struct console_replay_input {
    int dry_run;
    size_t n;
    int32_t partition[CONSOLE_MAX_POSITIONS];
    int64_t offset[CONSOLE_MAX_POSITIONS];
};

/* {"positions": ["P:O", ...] (1..CONSOLE_MAX_POSITIONS, no repeats),
 *  "dry_run": bool (required: a replay is always asked for knowingly)}. */
enum charged_rc console_input_replay(const char *body, size_t len,
                                     struct console_replay_input *out,
                                     struct charged_error *err);

/* One query parameter of the dead-letter list, checked as chargectl dlq
 * list checks its options: reason (a reason code), attempt and order
 * (UUIDs), since and until (an RFC 3339 UTC time or a duration ago: kept as
 * given, read by the caller), limit (1..1000). Unknown names are refused. */
struct console_letter_query {
    char reason[64];
    char attempt[37], order[37];
    char since[40], until[40];
    int64_t limit; /* 0: the default */
};
enum charged_rc console_input_letter_param(const char *name, const char *value,
                                           struct console_letter_query *q,
                                           struct charged_error *err);

/* ?id= of CONSOLE_R_FIND: a UUID (an attempt or an order) or a provider's
 * payment id (letters, digits, '_', shorter than PROVIDER_ID_MAX). */
enum charged_rc console_input_find_id(const char *value, char out[PROVIDER_ID_MAX],
                                      struct charged_error *err);

/* The session id in a Cookie header (CONSOLE_COOKIE=...), or -1 when there
 * is none or it is malformed. */
int console_input_cookie(const char *header, char out[CONSOLE_SECRET_MAX]);

/* "PARTITION:OFFSET", digits only, each within its type. 0 / -1. */
int console_input_position(const char *s, int32_t *partition, int64_t *offset);

#endif
