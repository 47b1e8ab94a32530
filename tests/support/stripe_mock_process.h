/* stripe_mock_process: runs stripe-mock, Stripe's own API mock, for a test.
 *
 * stripe-mock validates every request against Stripe's OpenAPI schema (a
 * parameter the schema does not know, or a value it refuses, is a 400) and
 * answers the schema's fixture data. The binary is CHARGED_STRIPE_MOCK, which
 * tests/CMakeLists.txt sets to what deploy/install-deps.sh installed; when
 * it is missing the test fails, it is never skipped.
 *
 * start binds loopback ports the kernel picks and reads the HTTP one from
 * stripe-mock's log, with a deadline; stop sends SIGTERM and reaps it. */
#ifndef CHARGED_STRIPE_MOCK_PROCESS_H
#define CHARGED_STRIPE_MOCK_PROCESS_H

#include <sys/types.h>

/* stripe-mock takes any key shaped sk_test_<something>. */
#define STRIPE_MOCK_TEST_KEY "sk_test_123"

struct stripe_mock_process {
    pid_t pid;
    int port;
    int log_fd; /* its stdout and stderr: an unlinked temporary file */
    char base_url[64];
};

/* Starts stripe-mock, or fails the test. */
void stripe_mock_start(struct stripe_mock_process *p);
void stripe_mock_stop(struct stripe_mock_process *p);

/* All it has logged so far, NUL-terminated (free() it). Per request it logs
 * "Request: <method> <path>", "Request data = map[...]" (the parameters as
 * it parsed them, before validating them) and "Response: ... status=<n>". */
char *stripe_mock_log(const struct stripe_mock_process *p);

#endif
