#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "clock.h"

static const char *level_names[] = {"debug", "info", "warn", "error"};

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_program[64] = "charged";
static enum log_level log_min = LOG_INFO;
static char **log_secrets; /* grown as needed: none is ever dropped */
static size_t log_secret_count, log_secret_cap;

int log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (s && !strcmp(s, level_names[i]))
            return i;
    return -1;
}

void log_init(const char *program, enum log_level level)
{
    pthread_mutex_lock(&log_lock);
    snprintf(log_program, sizeof(log_program), "%s", program);
    log_min = level;
    pthread_mutex_unlock(&log_lock);
}

int log_add_secret(const char *secret)
{
    int rc = 0;
    if (!secret || strlen(secret) < 4)
        return 0;
    pthread_mutex_lock(&log_lock);
    for (size_t i = 0; i < log_secret_count; i++) {
        if (!strcmp(log_secrets[i], secret))
            goto out;
    }
    if (log_secret_count == log_secret_cap) {
        size_t cap = log_secret_cap ? log_secret_cap * 2 : 16;
        char **grown = realloc(log_secrets, cap * sizeof(*grown));
        if (!grown) {
            rc = -1;
            goto out;
        }
        log_secrets = grown;
        log_secret_cap = cap;
    }
    char *copy = strdup(secret);
    if (!copy)
        rc = -1;
    else
        log_secrets[log_secret_count++] = copy;
out:
    pthread_mutex_unlock(&log_lock);
    return rc;
}

void log_clear_secrets(void)
{
    pthread_mutex_lock(&log_lock);
    for (size_t i = 0; i < log_secret_count; i++)
        free(log_secrets[i]);
    free(log_secrets);
    log_secrets = NULL;
    log_secret_count = log_secret_cap = 0;
    pthread_mutex_unlock(&log_lock);
}

/* Caller holds log_lock. Every byte of the input that some registered
 * secret covers is hidden, so that of two secrets that overlap, or of one
 * that begins with another, nothing shows; each run of hidden bytes is one
 * "[redacted]". */
static void redact_locked(const char *in, char *out, size_t out_size)
{
    size_t o = 0, hidden_to = 0;
    if (out_size == 0)
        return;
    for (size_t i = 0; in[i] && o + 1 < out_size; i++) {
        int run_starts = 0;
        for (size_t s = 0; s < log_secret_count; s++) {
            size_t n = strlen(log_secrets[s]);
            if (!strncmp(in + i, log_secrets[s], n)) {
                run_starts |= i >= hidden_to;
                if (i + n > hidden_to)
                    hidden_to = i + n;
            }
        }
        if (run_starts) {
            for (const char *r = "[redacted]"; *r && o + 1 < out_size;)
                out[o++] = *r++;
        } else if (i >= hidden_to) {
            out[o++] = in[i];
        }
    }
    out[o] = '\0';
}

void log_redact(const char *in, char *out, size_t out_size)
{
    pthread_mutex_lock(&log_lock);
    redact_locked(in, out, out_size);
    pthread_mutex_unlock(&log_lock);
}

void log_write(enum log_level level, const char *msg, ...)
{
    char ts[CLOCK_RFC3339_SIZE], buf[2048];
    json_t *obj;
    char *line;
    va_list ap;

    if (level < log_min)
        return;
    clock_rfc3339(clock_wall_ms(), ts, sizeof(ts));

    obj = json_object();
    if (!obj)
        return;
    pthread_mutex_lock(&log_lock);
    /* json_object_set_new steals the new string's reference. */
    json_object_set_new(obj, "ts", json_string(ts));
    json_object_set_new(obj, "level", json_string(level_names[level]));
    json_object_set_new(obj, "program", json_string(log_program));
    redact_locked(msg, buf, sizeof(buf));
    /* json_string refuses invalid UTF-8; keep the line, mark the text. */
    json_t *jm = json_string(buf);
    json_object_set_new(obj, "msg", jm ? jm : json_string("[invalid utf-8]"));
    va_start(ap, msg);
    for (;;) {
        const char *k = va_arg(ap, const char *);
        const char *v;
        if (!k)
            break;
        v = va_arg(ap, const char *);
        if (!v)
            continue;
        redact_locked(v, buf, sizeof(buf));
        json_t *jv = json_string(buf);
        json_object_set_new(obj, k, jv ? jv : json_string("[invalid utf-8]"));
    }
    va_end(ap);
    line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (line) {
        fprintf(stderr, "%s\n", line);
        fflush(stderr);
        free(line);
    }
    pthread_mutex_unlock(&log_lock);
    json_decref(obj);
}
