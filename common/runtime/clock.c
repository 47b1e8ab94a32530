#include "clock.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t clock_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t clock_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *clock_rfc3339(int64_t wall_ms, char *buf, size_t size)
{
    time_t secs = (time_t)(wall_ms / 1000);
    struct tm tm;
    char day[24];

    gmtime_r(&secs, &tm);
    strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, size, "%s.%03dZ", day, (int)(wall_ms % 1000));
    return buf;
}

int clock_parse_duration_ms(const char *s, int64_t *ms)
{
    char *end;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    long long v = strtoll(s, &end, 10);
    int64_t unit;
    if (!strcmp(end, "s"))
        unit = 1000;
    else if (!strcmp(end, "m"))
        unit = 60 * 1000;
    else if (!strcmp(end, "h"))
        unit = 3600 * 1000;
    else if (!strcmp(end, "d"))
        unit = 86400 * 1000;
    else
        return -1;
    if (v < 0 || v > 100LL * 365 * 86400)
        return -1;
    *ms = v * unit;
    return 0;
}

int clock_parse_rfc3339(const char *s, int64_t *wall_ms)
{
    struct tm tm = {0};
    const char *rest = strptime(s ? s : "", "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest)
        return -1;
    int64_t frac = 0;
    if (*rest == '.') {
        int digits = 0;
        rest++;
        while (isdigit((unsigned char)*rest)) {
            if (digits++ < 3)
                frac = frac * 10 + (*rest - '0');
            rest++;
        }
        while (digits++ < 3)
            frac *= 10;
    }
    if (strcmp(rest, "Z") != 0 && strcmp(rest, "+00:00") != 0)
        return -1;
    *wall_ms = (int64_t)timegm(&tm) * 1000 + frac;
    return 0;
}

int clock_parse_time_ms(const char *s, int64_t *epoch_ms)
{
    int64_t d;
    if (clock_parse_duration_ms(s, &d) == 0) {
        *epoch_ms = clock_wall_ms() - d;
        return 0;
    }
    return clock_parse_rfc3339(s, epoch_ms);
}
