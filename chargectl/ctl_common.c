/* What chargectl's commands share: configuration, parsing, who runs it. */
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "chargectl.h"
#include "log.h"

config_t *ctl_config(const char *cmd)
{
    char err[512];
    config_t *cfg = config_new(CONFIG_ROLE_CTL, "ctl", err, sizeof(err));
    if (!cfg) {
        fprintf(stderr, "chargectl %s: %s\n", cmd, err);
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

int ctl_parse_number(const char *s, int64_t max, int64_t *out, const char **rest)
{
    int64_t v = 0;
    const char *p = s;
    if (!s || *s < '0' || *s > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        int d = *p - '0';
        if (d > max || v > (max - d) / 10) /* v * 10 + d > max, without overflow */
            return -1;
        v = v * 10 + d;
    }
    if (rest)
        *rest = p;
    else if (*p)
        return -1;
    *out = v;
    return 0;
}

const char *ctl_os_user(void)
{
    struct passwd *pw = getpwuid(geteuid());
    if (pw && pw->pw_name && *pw->pw_name)
        return pw->pw_name;
    const char *u = getenv("USER");
    return u && *u ? u : NULL;
}
