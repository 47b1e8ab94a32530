/* chargectl: the operator CLI. Each subcommand lives in its own ctl_*.c and
 * returns the process exit status (0 ok, 1 runtime failure, 2 bad usage). */
#ifndef CHARGED_CHARGECTL_H
#define CHARGED_CHARGECTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "budget_alloc.h"
#include "config.h"
#include "provider_client.h"

enum ctl_exit { CTL_OK = 0, CTL_FAILED = 1, CTL_USAGE = 2 };

/* chargectl's configuration; on a bad value prints "chargectl <cmd>: why"
 * and returns NULL (the caller exits CTL_USAGE). Free with config_free. */
config_t *ctl_config(const char *cmd);

/* Say "chargectl <cmd>: bad option 'x' (see ... --help)" or "unexpected
 * argument 'x'" in one line; both return CTL_USAGE. */
int ctl_bad_option(const char *cmd, const char *arg);
int ctl_unexpected_argument(const char *cmd, const char *arg);

/* Says "chargectl <cmd>[ <sub>]: ..." in one line on stderr (sub NULL:
 * none); returns rc, so that a refusal is one statement. */
__attribute__((format(printf, 4, 5))) int
ctl_say(int rc, const char *cmd, const char *sub, const char *fmt, ...);

/* Prints text, words separated by single spaces, as lines of at most
 * width characters (a longer word stands alone), each ended by "\n", the
 * lines after the first begun by indent (not counted in width). */
void ctl_wrap(FILE *out, const char *indent, const char *text, size_t width);

/* Who runs chargectl, for --actor's default: the effective user's name,
 * else $USER; NULL when neither is known. */
const char *ctl_os_user(void);

/* The longest a chargectl request waits for its share of the fleet's
 * provider budget before it is not sent (a resolve must not hang). */
#define CTL_BUDGET_WAIT_MS 5000

/* A provider client of chargectl's settings whose every request draws from
 * the fleet's provider budget for prio (PROVIDER_BUDGET; a one-shot member:
 * it refreshes while it waits, at most CTL_BUDGET_WAIT_MS a request, and
 * the request answers why it was not sent). NULL and err on a bad setting.
 * One at a time; ctl_provider_close leaves the budget and frees it. */
provider_client_t *ctl_provider_open(const config_t *cfg, enum budget_priority prio,
                                     struct charged_error *err);
void ctl_provider_close(provider_client_t *pc);

int ctl_migrate(int argc, char **argv);
int ctl_publish(int argc, char **argv);
int ctl_dlq(int argc, char **argv);
int ctl_attempt(int argc, char **argv);
/* chargectl attempt resolve; argv[0] is "resolve". */
int ctl_attempt_resolve(int argc, char **argv);
/* chargectl refund show|list|resolve. */
int ctl_refund(int argc, char **argv);
/* chargectl <noun> list|resolve: the records of an operation with a
 * review (op.h's review; argv[0] is its noun). */
struct step_review_kind;
int ctl_step(const struct step_review_kind *k, int argc, char **argv);
/* chargectl audit list|show|run. */
int ctl_audit(int argc, char **argv);
/* chargectl console token add|list|revoke. */
int ctl_console(int argc, char **argv);
/* chargectl provider limits show|set: the fleet's provider budget. */
int ctl_provider(int argc, char **argv);

#endif
