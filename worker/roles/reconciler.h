/* reconciler: the `charged reconciler` role. Settles attempts whose outcome
 * is unknown (UNKNOWN, PROCESSING on the provider's word, PROCESSING left by
 * a worker that never came back) on the provider's own evidence, never by
 * guessing. See docs/reconciler.md. */
#ifndef CHARGED_RECONCILER_H
#define CHARGED_RECONCILER_H

#include "daemon.h"

/* The role, as daemon_role_main runs it (main.c's table). */
extern const struct daemon_role_desc reconciler_role;

#endif
