/* api: the `charged api` role. Receives the provider's webhooks (verified,
 * deduplicated, applied in one transaction each) and answers status
 * queries from the database. See docs/api.md. */
#ifndef CHARGED_API_H
#define CHARGED_API_H

/* The role's main: reads the environment, runs until SIGTERM. Returns the
 * process's exit status. */
int api_main(int argc, char **argv);

#endif
