/* webhook_apply: what webhook_store gives an operation's half of applying
 * a provider's event (op.h's struct op_webhook). The half runs inside the
 * store's transaction, on its connection, after the event was recorded:
 * it never commits or rolls back (the store does, on its answer). */
#ifndef CHARGED_WEBHOOK_APPLY_H
#define CHARGED_WEBHOOK_APPLY_H

#include "store.h"
#include "store_conn.h"

/* A statement after the event was recorded failed (rc): the event itself
 * was taken, so a refused value is not the event's (a bug, or a
 * constraint the decision missed) and the delivery is answered "again",
 * as for an outage: the rc to answer. */
enum charged_rc webhook_apply_later_failed(enum charged_rc rc);

/* Makes the UNKNOWN record `id` due for the reconciler now (sql: the
 * operation's statement, $1 the id). CHARGED_OK, or the failure as
 * webhook_apply_later_failed answers it. */
enum charged_rc webhook_apply_check_now(store_conn_t *db, const char *sql,
                                        const char *id, struct charged_error *err);

#endif
