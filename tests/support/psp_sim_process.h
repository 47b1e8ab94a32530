/* psp_sim_process: runs a real psp-sim for a test and talks to its admin API.
 *
 * Each instance binds loopback ports the kernel picks (--port 0) and start
 * reads them from psp-sim's first stdout line, with a deadline; stop sends
 * SIGTERM and reaps it. */
#ifndef CHARGED_PSP_SIM_PROCESS_H
#define CHARGED_PSP_SIM_PROCESS_H

#include <sys/types.h>
#include <jansson.h>

#define PSP_SIM_TEST_KEY "sk_test_psp_sim_unit"

struct psp_sim_process {
    pid_t pid;
    int port, admin_port;
    char base_url[64];
    /* Optional, set before psp_sim_start: "NAME=value" strings (NULL-
     * terminated) added to its environment, and a file its stderr goes to
     * (else to ours). */
    const char *const *env;
    const char *stderr_path;
    char first_line[256]; /* what it printed on stdout: its only output there */
};

/* Starts psp-sim with extra flags (NULL-terminated), or fails the test. */
void psp_sim_start(struct psp_sim_process *p, const char *const *extra_args);
void psp_sim_stop(struct psp_sim_process *p);

/* Admin request; returns the parsed JSON answer (new reference) or fails. */
json_t *psp_sim_admin(struct psp_sim_process *p, const char *method, const char *path,
                      const char *body);

/* Charges in the ledger, and how many have this idempotency key. */
size_t psp_sim_charges(struct psp_sim_process *p);
size_t psp_sim_charges_for_key(struct psp_sim_process *p, const char *key);

/* A loopback port nobody listens on right now (to test refused
 * connections; not for psp-sim, which binds port 0). */
int psp_sim_free_port(void);

#endif
