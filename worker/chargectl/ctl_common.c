/* What chargectl's commands share: configuration, parsing, who runs it. */
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "chargectl.h"
#include "log.h"

config_t *ctl_config(const char *cmd)
{
    struct charged_error err;
    config_t *cfg = config_new(CONFIG_ROLE_CTL, "ctl", &err);
    if (!cfg) {
        fprintf(stderr, "chargectl %s: %s\n", cmd, err.message);
        return NULL;
    }
    /* Errors are ours, one line each: librdkafka's chatter stays quiet. */
    log_init("chargectl", LOG_OFF);
    return cfg;
}

int ctl_bad_option(const char *cmd, const char *arg)
{
    fprintf(stderr, "chargectl %s: bad option '%s' (see chargectl %s --help)\n", cmd,
            arg ? arg : "", cmd);
    return CTL_USAGE;
}

int ctl_unexpected_argument(const char *cmd, const char *arg)
{
    fprintf(stderr, "chargectl %s: unexpected argument '%s'\n", cmd, arg);
    return CTL_USAGE;
}

int ctl_say(int rc, const char *cmd, const char *sub, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "chargectl %s%s%s: ", cmd, sub ? " " : "", sub ? sub : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return rc;
}

const char *ctl_os_user(void)
{
    struct passwd *pw = getpwuid(geteuid());
    if (pw && pw->pw_name && *pw->pw_name)
        return pw->pw_name;
    const char *u = getenv("USER");
    return u && *u ? u : NULL;
}
