/* relay: the `charged relay` role. Publishes the outbox's result events to
 * Kafka, in order, marking each published only once the broker acknowledged
 * it. See docs/relay.md. */
#ifndef CHARGED_RELAY_H
#define CHARGED_RELAY_H

/* The role's main: reads the environment, runs until SIGTERM. Returns the
 * process's exit status. */
int relay_main(int argc, char **argv);

#endif
