/* chargectl: the operator CLI. Each subcommand lives in its own ctl_*.c and
 * returns the process exit status (0 ok, 1 runtime failure, 2 bad usage). */
#ifndef CHARGED_CHARGECTL_H
#define CHARGED_CHARGECTL_H

enum ctl_exit { CTL_OK = 0, CTL_FAILED = 1, CTL_USAGE = 2 };

int ctl_migrate(int argc, char **argv);
int ctl_publish(int argc, char **argv);
int ctl_dlq(int argc, char **argv);
int ctl_attempt(int argc, char **argv);

#endif
