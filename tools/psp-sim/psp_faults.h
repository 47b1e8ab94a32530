/* psp_faults: which faults psp-sim injects into a request, and when.
 *
 * Each rule has a kind, a probability, an optional target (one idempotency
 * key or one payment method) and an optional budget of times. Decisions are
 * a hash of (seed, kind, key, how many times this key was seen), so a run
 * with the same seed and the same requests per key faults the same way,
 * whatever order concurrent requests arrive in. Thread-safe. */
#ifndef PSP_FAULTS_H
#define PSP_FAULTS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

enum psp_fault_kind {
    PSP_FAULT_ERROR_BEFORE, /* answer 500, nothing executed */
    PSP_FAULT_RATE_LIMIT,   /* answer 429, nothing executed */
    PSP_FAULT_ERROR_AFTER,  /* execute, then answer 500 */
    PSP_FAULT_STALL_AFTER, /* execute, then hold the answer past the client's timeout */
    PSP_FAULT_DROP_AFTER,  /* execute, then close the connection unanswered */
    PSP_FAULT__COUNT
};

typedef struct psp_faults psp_faults_t;

psp_faults_t *psp_faults_new(uint64_t seed);
void psp_faults_free(psp_faults_t *f);

/* Name of a kind ("error_before", ...) and back; -1 when unknown. */
const char *psp_fault_name(enum psp_fault_kind kind);
int psp_fault_parse(const char *name);

/* Adds a rule. key / payment_method may be NULL (any); times < 0: no limit. */
int psp_faults_add(psp_faults_t *f, enum psp_fault_kind kind, double probability,
                   const char *key, const char *payment_method, long times);
void psp_faults_set_latency(psp_faults_t *f, int64_t fixed_ms, int64_t jitter_ms);
void psp_faults_set_stall(psp_faults_t *f, int64_t stall_ms);

/* Replaces the whole configuration from JSON:
 *   {"seed":1, "latency_ms":5, "latency_jitter_ms":15, "stall_ms":30000,
 *    "rules":[{"kind":"drop_after", "probability":0.1, "key":"k1",
 *              "payment_method":null, "times":1}]}
 * Absent members take their defaults. 0 / -1 with errbuf. */
int psp_faults_configure(psp_faults_t *f, json_t *cfg, char *errbuf,
                         size_t errbuf_size);
/* The configuration, how often each rule fired, and every fault injected
 * since it was set ("hits": kind, key, seq) (new reference). */
json_t *psp_faults_json(psp_faults_t *f);

/* Call once per request: returns the request's sequence number for its key
 * (0 for the first request with that key). */
uint64_t psp_faults_next_seq(psp_faults_t *f, const char *key);

/* Whether a fault of `kind` hits this request; counts it when it does. */
int psp_faults_hit(psp_faults_t *f, enum psp_fault_kind kind, const char *key,
                   const char *payment_method, uint64_t seq);

/* Latency to add to this request, and how long a stall lasts. */
int64_t psp_faults_latency_ms(psp_faults_t *f, const char *key, uint64_t seq);
int64_t psp_faults_stall_ms(psp_faults_t *f);

#endif
