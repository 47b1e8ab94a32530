/* console: the `charged console` role. The operator console in a browser,
 * on its own listener (CONSOLE_ADDR): the overview, the review queue, dead
 * letters and an attempt's story, behind operator tokens. See
 * docs/console.md. */
#ifndef CHARGED_CONSOLE_H
#define CHARGED_CONSOLE_H

#include "daemon.h"

/* The role, as daemon_role_main runs it (main.c's table). */
extern const struct daemon_role_desc console_role;

#endif
