/* api: the `charged api` role. Receives the provider's webhooks (verified,
 * deduplicated, applied in one transaction each) and answers status
 * queries from the database. See docs/api.md. */
#ifndef CHARGED_API_H
#define CHARGED_API_H

#include "daemon.h"

/* The role, as daemon_role_main runs it (main.c's table). */
extern const struct daemon_role_desc api_role;

#endif
