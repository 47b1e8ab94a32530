/* audit_store: the auditor's side of the database — its copy of the
 * provider's books (audit_intents, audit_refunds), its findings, the
 * objects it must look at again, and the verdict of each window.
 *
 * The auditor never writes a table of the charge's path; it reads the
 * ledger and the attempts to match what the provider listed. Every call is
 * safe to repeat: a window audited again, or by two auditors, records each
 * finding once (UNIQUE per kind and object) and each scheduled window once
 * (UNIQUE on its start). One auditor leads the scheduled windows at a time:
 * a session-level advisory lock, gone with its connection. */
#ifndef CHARGED_AUDIT_STORE_H
#define CHARGED_AUDIT_STORE_H

#include <stddef.h>

#include "audit_policy.h"
#include "provider_outcome.h"
#include "store.h"

typedef struct audit_store audit_store_t;

/* Every fallible call returns an enum charged_rc (store.h) and fills err. */

/* Does not connect. NULL and err when database_url cannot be parsed. */
audit_store_t *audit_store_new(const char *database_url, struct charged_error *err);
void audit_store_free(audit_store_t *st);

/* CHARGED_OK when this process leads the scheduled windows, CHARGED_NOT_LEADER
 * when another does. */
enum charged_rc audit_store_lead(audit_store_t *st, struct charged_error *err);

/* The next scheduled window, on the database's clock: it starts at the
 * watermark (the end of the last scheduled window recorded; before the
 * first, at from_unix when > 0, else at the first attempt's creation, else
 * now less the lag) and lasts window_s; due when it ended lag_ms ago. */
struct audit_window {
    long long start, end; /* unix s */
    int due;
    long long watermark_age_ms; /* now - start: how far the audit is behind */
    long long now_ms;           /* the database's clock */
};
enum charged_rc audit_store_next_window(audit_store_t *st, long long from_unix,
                                        long long window_s, long long lag_ms,
                                        struct audit_window *w,
                                        struct charged_error *err);
/* The database's clock, unix ms. */
enum charged_rc audit_store_now(audit_store_t *st, long long *now_ms,
                                struct charged_error *err);

/* A listed intent and what charged has of it: facts for audit_policy, and
 * the ids an operator needs. */
struct audit_intent_row {
    struct audit_intent_facts facts; /* points into this row and the listed item */
    char attempt_status[24];
    char booked_currency[8];
    char booked_attempt[40];            /* the ledger row's attempt */
    char other_object[PROVIDER_ID_MAX]; /* the other charge: booked for the attempt or
                              order, or the earlier twin */
    char recorded[PROVIDER_ID_MAX]; /* the named attempt's own intent, as recorded */
    char booked_order[40];          /* the ledger row's order */
    /* A manual intent's steps (audit_policy_steps): the attempt that
     * recorded the intent, its order and currency. */
    struct audit_step_facts steps; /* points into this row and the listed item */
    char step_attempt[40];
    char step_status[24];
    char step_order[40];
    char step_currency[8];
};

/* Copies the page into audit_intents (the provider's word, refreshed) and
 * fills rows[i] for items[i]: its steps' facts with the columns of the
 * operations' rules, steps. */
enum charged_rc audit_store_intents(audit_store_t *st,
                                    const struct provider_listed *items, size_t n,
                                    const struct audit_step_table *steps,
                                    struct audit_intent_row *rows,
                                    struct charged_error *err);

/* An unbooked succeeded intent in the copy that names only an order (no
 * attempt): its creation (unix s), amount and currency. */
struct audit_order_stray {
    char id[PROVIDER_ID_MAX];
    long long created, amount;
    char currency[8];
};
/* Up to max of them naming order (a UUID, as the ledger keeps it, in any
 * case in the copy), other than booked, after (after_created, after_id) in
 * (created, id) order: *n says how many. A page shorter than max is the
 * last. */
enum charged_rc audit_store_order_strays(audit_store_t *st, const char *order,
                                         const char *booked, long long after_created,
                                         const char *after_id,
                                         struct audit_order_stray *out, size_t max,
                                         size_t *n, struct charged_error *err);

struct audit_refund_row {
    struct audit_refund_facts facts;
    char refund_status[24];
    char refund_attempt[40];     /* the refund attempt its metadata names */
    long long refunded_total;    /* succeeded refunds of its intent, as listed */
    long long charge_amount;     /* the ledger's charge on its intent, else the
                                    provider's intent; -1 when neither is known */
    char payment_attempt_id[40]; /* the charge's, when booked */
    char order_id[40];
    char booked_intent[PROVIDER_ID_MAX]; /* the booked refund attempt's charge */
};

enum charged_rc audit_store_refunds(audit_store_t *st,
                                    const struct provider_listed *items, size_t n,
                                    struct audit_refund_row *rows,
                                    struct charged_error *err);

/* Ledger rows booked in [start, end) (charges and refunds). */
enum charged_rc audit_store_ledger_count(audit_store_t *st, long long start,
                                         long long end, long long *count,
                                         struct charged_error *err);

/* A ledger row the provider's books, as copied so far, do not confirm. */
struct audit_ledger_row {
    long long id;
    int refund;                      /* a refund row (else a charge) */
    char object_id[PROVIDER_ID_MAX]; /* the provider's pi_ or re_ */
    long long amount;
    char currency[8];
    char payment_attempt_id[40];
    char order_id[40];
    char refund_id[40];
    long long created; /* the second it was booked, unix s */
};
/* Up to max rows booked in [start, end) with id > after_id, in id order,
 * whose object is not in the copy as succeeded with the same amount and
 * currency. *n says how many. */
enum charged_rc audit_store_ledger_unmatched(audit_store_t *st, long long start,
                                             long long end, long long after_id,
                                             struct audit_ledger_row *rows, size_t max,
                                             size_t *n, struct charged_error *err);

/* The ledger row booked on the provider object object_id (a refund's when
 * refund, else a charge's): *found 0 when there is none. */
enum charged_rc audit_store_ledger_of(audit_store_t *st, const char *object_id,
                                      int refund, struct audit_ledger_row *row,
                                      int *found, struct charged_error *err);

/* One finding. object_id is the unique key with kind; the rest may be "". */
struct audit_finding {
    enum audit_kind kind;
    const char *object_id;
    const char *payment_attempt_id, *order_id, *refund_id, *other_object_id;
    long long provider_amount, ledger_amount; /* < 0: none */
    const char *provider_currency, *ledger_currency;
    const char *detail;
    /* The second of the object (its creation at the provider, or its
     * booking), so that every audit whose window holds the object finds
     * the finding inside it: [s, s + 1), unix s. */
    long long window_start, window_end;
};
/* Records it unless already recorded: *fresh says which. */
enum charged_rc audit_store_add_finding(audit_store_t *st,
                                        const struct audit_finding *f, int *fresh,
                                        struct charged_error *err);

/* Objects judged: those in done[] leave the pending list, those in
 * wait[] are on it (refreshed); kind "intent" or "refund". */
enum charged_rc audit_store_pending(audit_store_t *st, const char *kind,
                                    const char *const *done, size_t ndone,
                                    const char *const *wait, size_t nwait,
                                    struct charged_error *err);
/* Up to max pending objects, the longest unchecked first, marked checked:
 * ids[i] and kinds[i] ("intent" / "refund"), *n how many. */
enum charged_rc audit_store_pending_due(audit_store_t *st, size_t max,
                                        char (*ids)[PROVIDER_ID_MAX], int *is_refund,
                                        size_t *n, struct charged_error *err);
enum charged_rc audit_store_pending_count(audit_store_t *st, long long *count,
                                          struct charged_error *err);

/* The findings recorded so far, by whichever audit, by kind. The table
 * only grows: the counts only grow too. */
enum charged_rc audit_store_findings_by_kind(audit_store_t *st,
                                             long long counts[AUDIT_KIND__COUNT],
                                             struct charged_error *err);

/* A finished audit. */
struct audit_verdict {
    long long start, end; /* unix s */
    int scheduled;
    const char *auditor;
    long long intents, refunds, ledger_rows, pending;
    long long findings[AUDIT_KIND__COUNT]; /* observed in this audit, by kind */
    long long started_ms;                  /* unix ms */
};
/* Records it. A scheduled window another auditor recorded first is not
 * recorded again: *recorded 0. *id: the verdict's row (0 when not). */
enum charged_rc audit_store_finish(audit_store_t *st, const struct audit_verdict *v,
                                   int *recorded, long long *id,
                                   struct charged_error *err);

#endif
