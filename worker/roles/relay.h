/* relay: the `charged relay` role. Publishes the outbox's result events to
 * Kafka, in order, marking each published only once the broker acknowledged
 * it. See docs/relay.md. */
#ifndef CHARGED_RELAY_H
#define CHARGED_RELAY_H

#include "daemon.h"

/* The role, as daemon_role_main runs it (main.c's table). */
extern const struct daemon_role_desc relay_role;

#endif
