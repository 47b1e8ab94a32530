/* fleet_status: what the console's overview says of the running fleet
 * beyond the database: how far the workers' consumer group is behind on
 * the command topic (from Kafka itself, so that it is known also while
 * every worker is down), and each worker's provider breaker (from the
 * workers' own /metrics, charged_provider_breaker_state).
 *
 * Both are read when asked, with short timeouts: an overview that cannot
 * reach a worker says so for that worker instead of waiting for it. */
#ifndef CHARGED_FLEET_STATUS_H
#define CHARGED_FLEET_STATUS_H

#include <stddef.h>

#include <jansson.h>

#include "config.h"

/* The lag of consumer group `group` on `topic` (cfg's Kafka): {"group",
 * "topic", "total": n, "partitions": [{partition, committed, end, lag}]};
 * a partition without a committed offset counts from its start. Never joins
 * the group and never commits. NULL with err when Kafka does not answer
 * within timeout_ms or the topic is missing. */
json_t *fleet_status_lag(const config_t *cfg, const char *group, const char *topic,
                         int timeout_ms, struct charged_error *err);

/* The breaker of each worker whose metrics URL is in `urls` (comma
 * separated http://host:port/metrics; NULL or "": none): [{"url", "state":
 * "closed"|"half_open"|"open"|"unreachable", "error"}]; the URL is given
 * without its user information. */
json_t *fleet_status_breakers(const char *urls, int timeout_ms);

/* charged_provider_breaker_state's value in a Prometheus text body: 0, 1,
 * 2, or -1 when it is not there (parsing alone, for tests). */
int fleet_status_parse_breaker(const char *body, size_t len);

#endif
