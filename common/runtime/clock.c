#include "clock.h"

#include <stdio.h>
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
