/* worker: `charged worker`, which consumes charge commands and charges each
 * payment attempt at most once.
 *
 * One thread runs one loop over batches: validate (or dead-letter), record,
 * claim, call the provider (many transfers at once on one curl multi
 * handle), persist, and commit each partition's offsets up to its lowest
 * message whose effects are not yet durable. See docs/worker.md. */
#ifndef CHARGED_WORKER_H
#define CHARGED_WORKER_H

#include "daemon.h"

/* Runs the worker until SIGTERM/SIGINT; returns the exit status. */
/* The role, as daemon_role_main runs it (main.c's table). */
extern const struct daemon_role_desc worker_role;

#endif
