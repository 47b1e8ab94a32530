/* kafka_setup: librdkafka configuration shared by charged's programs.
 *
 * Order matters: program defaults first, then the operator's KAFKA_*
 * pass-through, then the settings correctness depends on (manual offset
 * commits, idempotent producer), which nobody may override. */
#ifndef CHARGED_KAFKA_SETUP_H
#define CHARGED_KAFKA_SETUP_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "config.h"

/* A conf with bootstrap.servers, client.id and librdkafka's logs routed to
 * our JSON logger. NULL and err on a bad value, or when the librdkafka
 * loaded at run time is older than charged needs (config_librdkafka_too_old). */
rd_kafka_conf_t *kafka_setup_conf(const config_t *cfg, const char *client_id,
                                  struct charged_error *err);

/* Sets one property. CHARGED_GIVE_UP with err when librdkafka refuses it (a
 * configuration error). */
enum charged_rc kafka_setup_set(rd_kafka_conf_t *conf, const char *name,
                                const char *value, struct charged_error *err);

/* What one charged producer's preset differs in from the others'. */
struct kafka_setup_producer {
    /* > 0: the default message.timeout.ms (KAFKA_* may override it). The
     * relay's batch stops waiting after RELAY_ACK_TIMEOUT_MS and publishes
     * again; a message still queued then must expire with it rather than be
     * produced beside its re-publication. 0: librdkafka's default. */
    long long message_timeout_ms;
    /* 1: message.max.bytes is set after the pass-through, so that no
     * KAFKA_* changes it. chargectl has always pinned it, the daemons have
     * not; kept apart so that neither's behaviour changes here. */
    int pin_message_max_bytes;
};

/* kafka_setup_conf's conf with the preset of every charged producer, in
 * the order above: the defaults linger.ms 5, message.max.bytes 4194304 (the
 * topics' max.message.bytes) and p's; the KAFKA_* pass-through; then
 * enable.idempotence=true and acks=all, which nobody may override: a retry
 * never duplicates or reorders within a partition. NULL and err on a
 * bad value (see kafka_setup_conf). */
rd_kafka_conf_t *kafka_setup_producer_conf(const config_t *cfg, const char *client_id,
                                           const struct kafka_setup_producer *p,
                                           struct charged_error *err);

/* Where a message of a kafka_setup_tool_producer landed, filled by its
 * delivery report (served by rd_kafka_poll / rd_kafka_flush). */
struct kafka_setup_delivery {
    int done;
    rd_kafka_resp_err_t err;
    int32_t partition;
    int64_t offset;
};

/* The producer of the operator's tools (chargectl, the console), one for
 * all of them: the preset above with message.max.bytes pinned, and
 * messages that carry a struct kafka_setup_delivery as their opaque (or
 * NULL). NULL and err on failure. */
rd_kafka_t *kafka_setup_tool_producer(const config_t *cfg, const char *client_id,
                                      struct charged_error *err);

/* With KAFKA_SECURITY_PROTOCOL SSL or SASL_*: connects to the brokers once,
 * before the role starts, and gives up (CHARGED_GIVE_UP, err one line) on
 * what no retry mends: TLS material that does not verify (a CA that did not
 * sign the brokers, an expired one, a file that is no CA) or credentials
 * the brokers refuse. Unreachable brokers are not its business: CHARGED_OK
 * once they are all down or timeout_ms passed, and the role waits for them
 * as ever. A no-op (CHARGED_OK) for PLAINTEXT. librdkafka's own logs of
 * the attempt are not written: err says it once. The daemons give it
 * KAFKA_SECURITY_CHECK_MS: three TLS handshakes and a SCRAM exchange take
 * well under a second; a start waits that long only for brokers that
 * neither answer nor refuse. */
#define KAFKA_SECURITY_CHECK_MS 10000
enum charged_rc kafka_setup_check_security(const config_t *cfg, int timeout_ms,
                                           struct charged_error *err);

/* Applies the KAFKA_* pass-through properties (validated by config_new). */
void kafka_setup_apply_env(rd_kafka_conf_t *conf, const config_t *cfg);

/* The operator's KAFKA_* value of one property, NULL when not given. */
const char *kafka_setup_pass_through(const config_t *cfg, const char *property);

/* 1 when KAFKA_GROUP_PROTOCOL=consumer (KIP-848): the broker assigns, and
 * the classic protocol's partition.assignment.strategy must not be set. */
int kafka_setup_uses_consumer_protocol(const config_t *cfg);

/* Static group membership: the consumer's group.instance.id is
 * KAFKA_GROUP_INSTANCE_ID (a pass-through property, already in conf) or,
 * when that is not set, POD_NAME. Writes the id used into out ("" for
 * none, dynamic membership). CHARGED_GIVE_UP with err, naming the variable, when the
 * id is not one Kafka accepts (1 to 249 characters of [A-Za-z0-9._-]). */
enum charged_rc kafka_setup_group_instance(rd_kafka_conf_t *conf, const config_t *cfg,
                                           char *out, size_t out_size,
                                           struct charged_error *err);

/* WORKER_ID, or <hostname>-<pid>-<random>: unique per process, so that a
 * restarted worker never mistakes a dead predecessor's lease for its own. */
void kafka_setup_worker_id(const config_t *cfg, char *out, size_t out_size);

#endif
