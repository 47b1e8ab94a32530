/* Fuzz target: the configuration loader (common/runtime/config), over an
 * environment. The input is NAME=VALUE lines; a NAME ending in _FILE gets
 * the path of a scratch file holding VALUE (a secret file), never a path of
 * the input's choosing; of a NAME given twice the first counts (getenv's
 * rule). The first byte is the mask of roles whose required
 * settings must be there (enum config_role). Each run starts from an empty environment
 * and no registered log secrets, so that nothing leaks from one run into the next.
 *
 * Properties: a configuration that loads holds each table setting exactly
 * as given; its librdkafka pass-through properties are lower-case dotted
 * names with values; a refusal names why in one line. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern char **environ;

#include "config.h"
#include "fuzz_check.h"
#include "log.h"

static char scratch[64];
static size_t scratch_files; /* 0..scratch_files-1 may exist */

static void remove_scratch(void)
{
    char path[128];
    for (size_t i = 0; i < scratch_files; i++) {
        snprintf(path, sizeof(path), "%s/%zu", scratch, i);
        unlink(path);
    }
    rmdir(scratch);
}

static const char *scratch_file(size_t i, const char *value)
{
    static char path[128];
    if (!scratch[0]) {
        /* In memory: on a disk each run's write and truncate costs more
         * than the whole load. */
        snprintf(scratch, sizeof(scratch), "/dev/shm/charged-fuzz-config.XXXXXX");
        FUZZ_CHECK(mkdtemp(scratch));
        atexit(remove_scratch);
    }
    if (i >= scratch_files)
        scratch_files = i + 1;
    snprintf(path, sizeof(path), "%s/%zu", scratch, i);
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f);
    fputs(value, f);
    fclose(f);
    return path;
}

static void check_loaded(const config_t *cfg)
{
    for (int k = 0; k < CONFIG__COUNT; k++) {
        const char *given = getenv(config_name((enum config_key)k));
        if (!given)
            continue;
        const char *v = config_str(cfg, (enum config_key)k);
        FUZZ_CHECK(v && !strcmp(v, given));
    }
    for (size_t i = 0; i < config_kafka_count(cfg); i++) {
        const char *prop, *value;
        config_kafka_get(cfg, i, &prop, &value);
        FUZZ_CHECK(prop && prop[0] && value);
        for (const char *p = prop; *p; p++)
            FUZZ_CHECK(*p != '_' && !(*p >= 'A' && *p <= 'Z'));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The environment is this run's array, not setenv()'s: glibc keeps
     * every string setenv was given, which grows the process and makes
     * each run look like a leak to libFuzzer. */
    static char *no_env[] = {NULL};
    if (size == 0)
        return 0;
    unsigned roles = data[0] & 0x3fu;
    data++;
    size--;
    size_t cap = 1;
    for (size_t i = 0; i < size; i++)
        cap += data[i] == '\n';
    char **env = calloc(cap + 1, sizeof(*env));
    FUZZ_CHECK(env);
    size_t n = 0;
    for (size_t i = 0; size > 0; i++) {
        size_t len;
        const uint8_t *line_at = fuzz_next_line(&data, &size, &len);
        char *line = fuzz_strndup(line_at, len);
        char *eq = strchr(line, '=');
        if (!eq || eq == line) {
            free(line);
            continue;
        }
        size_t nlen = (size_t)(eq - line);
        if (nlen > 5 && !strncmp(eq - 5, "_FILE", 5)) {
            const char *path = scratch_file(i, eq + 1);
            char *var = malloc(nlen + 1 + strlen(path) + 1);
            FUZZ_CHECK(var);
            memcpy(var, line, nlen + 1);
            strcpy(var + nlen + 1, path);
            free(line);
            line = var;
        }
        env[n++] = line;
    }
    environ = env;
    struct charged_error err = {0};
    config_t *cfg = config_new(roles, "worker", &err);
    if (cfg)
        check_loaded(cfg);
    else
        FUZZ_CHECK(memchr(err.message, '\0', sizeof(err.message)) && err.message[0] &&
                   !strchr(err.message, '\n'));
    config_free(cfg);
    log_clear_secrets();
    environ = no_env;
    for (size_t i = 0; i < n; i++)
        free(env[i]);
    free(env);
    return 0;
}
