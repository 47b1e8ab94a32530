/* auditor: the `charged auditor` role. Matches the provider's own list of
 * charges and refunds against the ledger, window by window, and records
 * every mismatch once. See docs/auditor.md. */
#ifndef CHARGED_AUDITOR_H
#define CHARGED_AUDITOR_H

#include "daemon.h"

/* The role, as daemon_role_main runs it (main.c's table). */
extern const struct daemon_role_desc auditor_role;

#endif
