/* op_shared: what every operation's descriptor (struct engine_op,
 * engine.h) does the same way, written once.
 *
 * OP_CALLBACKS and OP_STORE_CALLBACKS list an operation's callbacks in its
 * descriptor, each named after a prefix (<prefix>_open, ...): one list, so
 * that a callback every operation must have is added to all of them at
 * once, and an operation that lacks it does not build.
 *
 * The payment operations keep their records in a payment store
 * (attempt_store.h, refund_store.h: one face, each store with items of its
 * own). Their state begins with a struct op_store, and the stages that do
 * no more than hand a batch to the store are op_store's, for both:
 * OP_STORE_CALLBACKS(op_store). op_batch_new and op_batch_claimed are what
 * their own stages (record, claim) share. */
#ifndef CHARGED_OP_SHARED_H
#define CHARGED_OP_SHARED_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_store.h"
#include "charge_command.h"
#include "config.h"
#include "engine.h"
#include "provider_client.h"
#include "refund_store.h"
#include "store_conn.h"

/* The callbacks of an operation whose functions are prefix_open, ... */
#define OP_CALLBACKS(prefix) OP_CALLBACKS_SHARING(prefix, prefix)

/* The same for an operation whose own are only own_open and
 * own_event_type (what it is: its type, its events), the rest shared's
 * (op_attempts: a charge's and an authorization's, below). */
#define OP_CALLBACKS_SHARING(own, shared)                                              \
    .open = own##_open, .close = shared##_close, .parse = shared##_parse,              \
    .release = shared##_release, .id_of = shared##_id_of,                              \
    .order_of = shared##_order_of, .record = shared##_record, .claim = shared##_claim, \
    .start_call = shared##_start_call, .object_of = shared##_object_of,                \
    .event_type = own##_event_type

/* Its store's callbacks: prefix_ping, prefix_log_calls, ... */
#define OP_STORE_CALLBACKS(prefix)                                                     \
    .ping = prefix##_ping, .log_calls = prefix##_log_calls,                            \
    .persist = prefix##_persist, .renew = prefix##_renew,                              \
    .release_leases = prefix##_release_leases, .wait = prefix##_wait

/* The payment commands' topics: a charge and its refunds share one, keyed
 * by the payment attempt, so that a refund follows its charge in one
 * partition. */
#define OP_PAYMENT_TOPICS                                                              \
    .commands_topic_key = CONFIG_CHARGE_COMMANDS_TOPIC,                                \
    .dlq_topic_key = CONFIG_CHARGE_DLQ_TOPIC

/* A payment operation's store: the first member of its state, one of the
 * two set. */
struct op_store {
    attempt_store_t *attempts;
    refund_store_t *refunds;
};

/* Makes the store of the role's DATABASE_URL (refunds: the refund store)
 * for actor; does not connect. CHARGED_OK, or CHARGED_GIVE_UP and err (a
 * setting refused, out of memory). */
enum charged_rc op_store_open(struct op_store *s, int refunds, config_t *cfg,
                              const char *actor, struct charged_error *err);
void op_store_close(struct op_store *s);

/* The stages, for a state that begins with a struct op_store. */
enum charged_rc op_store_ping(void *op, struct charged_error *err);
enum charged_rc op_store_log_calls(void *op, const struct engine_call *calls, size_t n,
                                   struct charged_error *err);
enum charged_rc op_store_persist(void *op, struct engine_outcome *items, size_t n,
                                 struct charged_error *err);
enum charged_rc op_store_renew(void *op, const char *const *ids, const int *kinds,
                               const int64_t *epochs, size_t n, long long lease_ms,
                               int *still_ours, struct charged_error *err);
enum charged_rc op_store_release_leases(void *op, const char *const *ids,
                                        const int *kinds, const int64_t *epochs,
                                        size_t n, struct charged_error *err);
enum charged_rc op_store_wait(void *op, const struct store_wait *items, size_t n,
                              struct charged_error *err);

/* ---- operations over payment attempts: a charge, an authorization ----
 *
 * Both record a command of a charge's fields (charge_command.h) as a
 * payment attempt, claim it, and send it as a payment under its key; they
 * differ in their command's type, in whether the money is taken or held
 * (the attempt's capture_method), and in the events they publish and the
 * answers they settle on. One set of stages, so that neither copies the
 * other's: OP_CALLBACKS_SHARING(own, op_attempts). */

/* Its state: the store first (op_store's stages take the state). */
struct op_attempts {
    struct op_store store;
    struct charge_command_limits limits;
    const char *command_type; /* "charge.requested", "authorization.requested" */
    int manual;               /* its attempts are authorizations */
};

/* The state of the role's configuration for commands of command_type (a
 * string literal); NULL and err when it cannot be built. */
void *op_attempts_open(config_t *cfg, const char *actor, const char *command_type,
                       int manual, struct charged_error *err);
void op_attempts_close(void *op);
enum dead_letter_reason op_attempts_parse(void *op, const void *key, size_t key_len,
                                          const void *value, size_t value_len,
                                          void *command, struct charged_error *err);
void op_attempts_release(void *command);
const char *op_attempts_id_of(const void *command);
const char *op_attempts_order_of(const void *command);
enum charged_rc op_attempts_record(void *op, struct engine_record *items, size_t n,
                                   long long lease_ms, struct charged_error *err);
enum charged_rc op_attempts_claim(void *op, struct engine_claim *items, size_t n,
                                  long long lease_ms, struct charged_error *err);
/* engine_op.sets_aside of a charge, an authorization and a refund: every
 * record may be set aside, since their looks send a PROCESSING record
 * with no provider object again under its key (reconcile_policy's replay;
 * an authorization's retrieves the hold the replay names). */
int op_sets_aside(int kind);
/* An attempt's provider object: its payment method. */
const char *op_attempts_object_of(int kind, const void *params);
enum charged_rc op_attempts_start_call(void *op, provider_client_t *pc,
                                       const void *params, const void *command,
                                       void *tag, struct charged_error *err);

/* What a payment sends under an attempt's key for every role that sends
 * one (the worker's call and its retries, the reconciler's call again):
 * the stored attempt p (never the message's copy), an authorization as
 * one. The strings point into p and attempt_id, which must outlive the
 * call. One place, so that two roles can never send different parameters
 * under one key. */
struct provider_charge op_attempts_request(const struct attempt_params *p,
                                           const char *attempt_id);

/* A store's items for a batch of n of the engine's: n (at least one) of
 * size bytes, zeroed, freed with free(); NULL with err set when memory ran
 * out (the stage is tried again: return CHARGED_RETRY). */
void *op_batch_new(size_t n, size_t size, struct charged_error *err);

/* A step's persist is two statements in one transaction (the
 * authorization's side, then the step's row), each locking the step's row
 * SKIP LOCKED: a peer letting go of the row between them would have the
 * first skip it and the second write it, each deciding on half the
 * truth. So the transaction locks the rows first (lock_sql, stmt_lock_ids).
 * An outcome whose row another session holds is marked busy (nothing is
 * written; the engine persists it again shortly); *ours gets copies of the
 * others, in items' order (*nours of them; free() it whatever the answer),
 * and
 * op_outcomes_unpack gives their answers back to items. */
enum charged_rc op_outcomes_lock(store_conn_t *db, const char *lock_sql,
                                 struct engine_outcome *items, size_t n,
                                 struct engine_outcome **ours, size_t *nours,
                                 struct charged_error *err);
void op_outcomes_unpack(struct engine_outcome *items, size_t n,
                        const struct engine_outcome *ours, size_t nours);

/* A store's claim answered `result` for it: its lease (claimed: its
 * epoch, at least 1), the key's age, the status before the claim, and,
 * claimed, the params_size bytes of what to send. */
void op_batch_claimed(struct engine_claim *it, enum engine_claim_result result,
                      int64_t lease_epoch, int64_t key_age_ms, const char *status,
                      const void *params, size_t params_size);

#endif
