/* ownership: is this provider object ours to settle on?
 *
 * Metadata is anyone's to write: every client of the provider account (a
 * second integration, a dashboard user, a script, a replayed export) can
 * put our attempt's or refund's id in an object's metadata. So an object
 * that names us proves nothing. An object is ours only when
 *   - its id is the one we recorded from our own call's answer, or
 *   - it is the answer to our own call under our own idempotency key (the
 *     first execution, or the provider's replay of it).
 * An object recorded for another attempt or refund, a refund on another
 * charge's intent than ours, or an object whose metadata names another of
 * ours, is foreign. Anything else that names us is unproven: it is
 * recorded and shown, never settled on; the reconciler proves it the one
 * way that holds (the replay under our key).
 *
 * One rule for every path that settles or books: the api's webhooks, the
 * reconciler, the review (chargectl and the console) and the auditor.
 * Pure: no I/O. */
#ifndef CHARGED_OWNERSHIP_H
#define CHARGED_OWNERSHIP_H

#include <stddef.h>

enum ownership_verdict {
    OWNERSHIP_OURS = 0, /* proven ours: it may settle and be booked */
    OWNERSHIP_UNPROVEN, /* names us, nothing of ours proves it: never settles */
    OWNERSHIP_FOREIGN,  /* proven another's: never settles, reported */
};

/* What is known of one provider object (an intent or a refund) and of the
 * attempt or refund it might settle. Strings may be NULL or "" for none. */
struct ownership_claim {
    const char *recorded_id; /* the id we recorded from our own call's answer */
    const char *object_id;   /* the provider object's id */
    int own_answer;          /* it answered our own call under our key */
    int recorded_elsewhere;  /* its id is recorded for another of ours */
    /* Refunds: the intent our refund is on (our charge's), and the one the
     * object is on. A refund on another intent is never ours. */
    const char *parent_id;
    const char *object_parent_id;
    /* Its metadata names another attempt or refund of ours (never proof of
     * ownership, but enough to refuse it). */
    int names_another;
};

/* The verdict, and why in `why` (one line, ASCII) when not ours. */
enum ownership_verdict ownership_judge(const struct ownership_claim *c, char *why,
                                       size_t why_size);

/* "ours", "unproven", "foreign". */
const char *ownership_verdict_name(enum ownership_verdict v);

#endif
