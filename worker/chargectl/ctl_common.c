/* What chargectl's commands share: configuration, parsing, who runs it. */
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget_member.h"
#include "charged_assert.h"
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

void ctl_wrap(FILE *out, const char *indent, const char *text, size_t width)
{
    size_t col = 0;
    CHARGED_ASSERT(out && indent && text && width > 0);
    for (const char *w = text; *w;) {
        size_t len = strcspn(w, " ");
        if (col > 0 && col + 1 + len > width) {
            fprintf(out, "\n%s", indent);
            col = 0;
        } else if (col > 0) {
            fputc(' ', out);
            col++;
        }
        fwrite(w, 1, len, out);
        col += len;
        w += len;
        w += strspn(w, " ");
    }
    fputc('\n', out);
}

const char *ctl_os_user(void)
{
    struct passwd *pw = getpwuid(geteuid());
    if (pw && pw->pw_name && *pw->pw_name)
        return pw->pw_name;
    const char *u = getenv("USER");
    return u && *u ? u : NULL;
}

/* The one provider client of a chargectl command and its budget. */
static struct {
    budget_member_t *member;
    struct budget_caller caller;
} provider_budget;

provider_client_t *ctl_provider_open(const config_t *cfg, enum budget_priority prio,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(cfg != NULL && err != NULL);
    CHARGED_ASSERT(provider_budget.member == NULL); /* one at a time */
    provider_client_t *pc =
        provider_client_new(config_str(cfg, CONFIG_PROVIDER_BASE_URL),
                            config_str(cfg, CONFIG_PROVIDER_API_KEY),
                            config_str(cfg, CONFIG_PROVIDER_API_VERSION),
                            (long)config_int(cfg, CONFIG_PROVIDER_TIMEOUT_MS), err);
    if (!pc)
        return NULL;
    if (budget_member_join(cfg, "chargectl", 0, &provider_budget.member, err) !=
        CHARGED_OK) {
        provider_client_free(pc);
        return NULL;
    }
    provider_budget.caller = (struct budget_caller){
        .member = provider_budget.member,
        .prio = prio,
        .max_wait_ms = CTL_BUDGET_WAIT_MS,
        .stop = NULL,
    };
    provider_client_set_gate(pc, budget_member_gate, budget_member_gate_charge,
                             &provider_budget.caller);
    return pc;
}

void ctl_provider_close(provider_client_t *pc)
{
    if (!pc)
        return;
    budget_member_leave(provider_budget.member);
    budget_member_free(provider_budget.member);
    provider_budget.member = NULL;
    provider_client_free(pc);
}
