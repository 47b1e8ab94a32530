/* psp_sim: what psp-sim's HTTP layer shares between its files:
 * psp_sim_main.c (start-up, the timer that resumes suspended connections,
 * the requests' life), psp_api.c (the provider API), psp_admin.c (the admin
 * API) and psp_usage.c (--help). One process: the store, the faults, the
 * rate limits and the webhooks are its globals, set once at start. */
#ifndef PSP_SIM_H
#define PSP_SIM_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>
#include <microhttpd.h>

#include "psp_faults.h"
#include "psp_limits.h"
#include "psp_store.h"
#include "psp_webhooks.h"

enum req_state { ST_RECEIVING, ST_DELAYED, ST_STALLED };

struct form_pair {
    char *k, *v;
};

struct req {
    enum req_state state;
    struct MHD_Connection *conn;
    char *body;
    size_t len;
    int too_large;
    struct form_pair *form;
    size_t nform;
    int form_bad; /* a name or value decoded to a NUL byte or non-UTF-8 */
    char *idem_key;
    enum req_op { OP_CHARGE, OP_CANCEL, OP_REFUND, OP_CAPTURE } op;
    struct psp_charge_request charge;
    struct psp_cancel_request cancel;
    struct psp_capture_request capture;
    struct psp_refund_request refund;
    json_t *metadata; /* a refund's metadata[...] */
    char *intent_id;  /* a cancel's or a capture's, from the URL */
    uint64_t seq;
    int executing; /* the key is reserved: execute or release */
    int charging;  /* a charge request, counted in flight until freed */
};

extern psp_store_t *psp_sim_store;
extern psp_faults_t *psp_sim_faults;
extern psp_webhooks_t *psp_sim_webhooks;
extern psp_limits_t *psp_sim_limits;
/* The accepted secrets (--api-key, repeatable): each one an account with
 * its own rate-limit buckets, all sharing one set of books. */
#define PSP_SIM_MAX_KEYS 8
extern char *psp_sim_api_keys[PSP_SIM_MAX_KEYS];
extern size_t psp_sim_napi_keys;

int64_t psp_sim_now_ms(void);
/* The monotonic clock (the rate limiter's), in ms. */
int64_t psp_sim_mono_ms(void);
/* Suspends conn and has the timer resume it after delay_ms. */
void psp_sim_suspend_for(struct MHD_Connection *conn, int64_t delay_ms);

/* Answers (body taken; NULL: "{}") once what it tells of is on disk. */
enum MHD_Result psp_sim_respond(struct MHD_Connection *conn, int status, char *body,
                                int replayed);
/* As psp_sim_respond, with one more header (name NULL: none). */
enum MHD_Result psp_sim_respond_with(struct MHD_Connection *conn, int status,
                                     char *body, const char *name, const char *value);
enum MHD_Result psp_sim_respond_json(struct MHD_Connection *conn, int status,
                                     json_t *j);
enum MHD_Result psp_sim_respond_error(struct MHD_Connection *conn, int status,
                                      const char *type, const char *message);

/* s as a long in min..max: 0, or -1. */
int psp_sim_parse_long(const char *s, long min, long max, long *out);
/* 1 when s is UTF-8 (and holds no NUL), else 0. */
int psp_sim_utf8(const char *s);

/* A request whose body has arrived, to the provider API (/v1/...). */
enum MHD_Result psp_sim_provider_api(struct req *r, const char *url,
                                     const char *method);
/* A request resumed after its latency: executes and answers it. */
enum MHD_Result psp_sim_execute_and_answer(struct req *r);
/* A request to the admin API. */
enum MHD_Result psp_sim_admin_api(struct req *r, const char *url, const char *method);

void psp_sim_usage(FILE *out);

#endif
