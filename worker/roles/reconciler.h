/* reconciler: the `charged reconciler` role. Settles attempts whose outcome
 * is unknown (UNKNOWN, PROCESSING on the provider's word, PROCESSING left by
 * a worker that never came back) on the provider's own evidence, never by
 * guessing. See docs/reconciler.md. */
#ifndef CHARGED_RECONCILER_H
#define CHARGED_RECONCILER_H

/* The role's main: parses nothing but --help, reads the environment, runs
 * until SIGTERM. Returns the process's exit status. */
int reconciler_main(int argc, char **argv);

#endif
