/* auditor: the `charged auditor` role. Matches the provider's own list of
 * charges and refunds against the ledger, window by window, and records
 * every mismatch once. See docs/auditor.md. */
#ifndef CHARGED_AUDITOR_H
#define CHARGED_AUDITOR_H

/* The role's main: parses nothing but --help, reads the environment, runs
 * until SIGTERM. Returns the process's exit status. */
int auditor_main(int argc, char **argv);

#endif
