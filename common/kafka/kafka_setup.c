#include "kafka_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <uuid/uuid.h>

#include "log.h"

static void on_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
    (void)rk;
    /* syslog levels: 0..3 error, 4 warning, 5..6 info, 7 debug */
    enum log_level l = level <= 3   ? LOG_ERROR
                       : level == 4 ? LOG_WARN
                       : level <= 6 ? LOG_INFO
                                    : LOG_DEBUG;
    /* Pass-through properties go to consumer and producer alike; librdkafka's
     * notes that one of them ignores a property are not worth a warning. */
    if (fac && !strcmp(fac, "CONFWARN"))
        l = LOG_DEBUG;
    log_write(l, "librdkafka", "facility", fac, "detail", buf, NULL);
}

enum charged_rc kafka_setup_set(rd_kafka_conf_t *conf, const char *name,
                                const char *value, struct charged_error *err)
{
    char rderr[sizeof(err->message)];
    if (rd_kafka_conf_set(conf, name, value, rderr, sizeof(rderr)) !=
        RD_KAFKA_CONF_OK) {
        charged_error_set(err, "%s", rderr);
        return CHARGED_GIVE_UP;
    }
    charged_error_clear(err);
    return CHARGED_OK;
}

rd_kafka_conf_t *kafka_setup_conf(const config_t *cfg, const char *client_id,
                                  struct charged_error *err)
{
    /* The library loaded, not the one built against: a LD_LIBRARY_PATH or
     * an image that carries the distribution's librdkafka1 would bring
     * back the old rebalance bugs without a word. */
    if (config_librdkafka_too_old(err))
        return NULL;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (kafka_setup_set(conf, "bootstrap.servers",
                        config_str(cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS), err) ||
        kafka_setup_set(conf, "client.id", client_id, err)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set_log_cb(conf, on_log);
    return conf;
}

#define PRODUCER_MESSAGE_MAX_BYTES "4194304"

/* Before the pass-through: KAFKA_* may override these. */
static enum charged_rc set_producer_defaults(rd_kafka_conf_t *conf,
                                             const struct kafka_setup_producer *p,
                                             struct charged_error *err)
{
    char timeout_ms[32];
    snprintf(timeout_ms, sizeof(timeout_ms), "%lld", p->message_timeout_ms);
    if (kafka_setup_set(conf, "linger.ms", "5", err) ||
        (!p->pin_message_max_bytes &&
         kafka_setup_set(conf, "message.max.bytes", PRODUCER_MESSAGE_MAX_BYTES, err)) ||
        (p->message_timeout_ms > 0 &&
         kafka_setup_set(conf, "message.timeout.ms", timeout_ms, err)))
        return CHARGED_GIVE_UP;
    return CHARGED_OK;
}

/* After the pass-through: no KAFKA_* may change these. */
static enum charged_rc set_producer_guarantees(rd_kafka_conf_t *conf,
                                               const struct kafka_setup_producer *p,
                                               struct charged_error *err)
{
    if (kafka_setup_set(conf, "enable.idempotence", "true", err) ||
        kafka_setup_set(conf, "acks", "all", err) ||
        (p->pin_message_max_bytes &&
         kafka_setup_set(conf, "message.max.bytes", PRODUCER_MESSAGE_MAX_BYTES, err)))
        return CHARGED_GIVE_UP;
    return CHARGED_OK;
}

rd_kafka_conf_t *kafka_setup_producer_conf(const config_t *cfg, const char *client_id,
                                           const struct kafka_setup_producer *p,
                                           struct charged_error *err)
{
    rd_kafka_conf_t *conf = kafka_setup_conf(cfg, client_id, err);
    if (!conf)
        return NULL;
    if (set_producer_defaults(conf, p, err) != 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    kafka_setup_apply_env(conf, cfg);
    if (set_producer_guarantees(conf, p, err) != 0) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    return conf;
}

static void on_tool_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    struct kafka_setup_delivery *d = m->_private;
    (void)rk;
    (void)opaque;
    if (!d)
        return;
    d->done = 1;
    d->err = m->err;
    d->partition = m->partition;
    d->offset = m->offset;
}

rd_kafka_t *kafka_setup_tool_producer(const config_t *cfg, const char *client_id,
                                      struct charged_error *err)
{
    const struct kafka_setup_producer preset = {.pin_message_max_bytes = 1};
    rd_kafka_conf_t *conf = kafka_setup_producer_conf(cfg, client_id, &preset, err);
    if (!conf)
        return NULL;
    rd_kafka_conf_set_dr_msg_cb(conf, on_tool_delivery);
    char rderr[sizeof(err->message)];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, rderr, sizeof(rderr));
    if (!rk) {
        charged_error_set(err, "%s", rderr);
        rd_kafka_conf_destroy(conf);
    }
    return rk;
}

/* What the security check saw: the first error no retry mends, and whether
 * every broker is down (then there is nothing more to learn). */
struct security_check {
    rd_kafka_resp_err_t err;
    char reason[400];
    int all_down;
};

static void check_on_error(rd_kafka_t *rk, int code, const char *reason, void *opaque)
{
    struct security_check *c = opaque;
    (void)rk;
    if (code == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
        c->all_down = 1;
        return;
    }
    /* librdkafka reports a failed verification as a transport error too,
     * before it names the handshake. */
    if (c->err == RD_KAFKA_RESP_ERR_NO_ERROR &&
        (code == RD_KAFKA_RESP_ERR__SSL || code == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
         strstr(reason, "certificate verify failed"))) {
        c->err = code == RD_KAFKA_RESP_ERR__AUTHENTICATION
                     ? RD_KAFKA_RESP_ERR__AUTHENTICATION
                     : RD_KAFKA_RESP_ERR__SSL;
        snprintf(c->reason, sizeof(c->reason), "%s", reason);
    }
}

/* The attempt's own failures are err's to say, once. */
static void check_on_log(const rd_kafka_t *rk, int level, const char *fac,
                         const char *buf)
{
    (void)rk;
    (void)level;
    (void)fac;
    (void)buf;
}

enum charged_rc kafka_setup_check_security(const config_t *cfg, int timeout_ms,
                                           struct charged_error *err)
{
    const char *protocol = kafka_setup_pass_through(cfg, "security.protocol");
    struct security_check c = {0};
    char rderr[sizeof(err->message)];
    enum charged_rc rc = CHARGED_OK;

    if (!protocol || !strcasecmp(protocol, "plaintext"))
        return CHARGED_OK;
    rd_kafka_conf_t *conf = kafka_setup_conf(cfg, "charged-security-check", err);
    if (!conf)
        return CHARGED_GIVE_UP;
    kafka_setup_apply_env(conf, cfg);
    rd_kafka_conf_set_opaque(conf, &c);
    rd_kafka_conf_set_error_cb(conf, check_on_error);
    rd_kafka_conf_set_log_cb(conf, check_on_log);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, rderr, sizeof(rderr));
    if (!rk) {
        /* A CA file that holds no certificate, a key that does not load. */
        charged_error_set(err, "Kafka TLS settings refused: %s", rderr);
        rd_kafka_conf_destroy(conf);
        return CHARGED_GIVE_UP;
    }
    for (int waited = 0; waited < timeout_ms; waited += 200) {
        const struct rd_kafka_metadata *md = NULL;
        /* No topic: the brokers only, which any principal may ask for. */
        rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, NULL, &md, 200);
        if (md)
            rd_kafka_metadata_destroy(md);
        rd_kafka_poll(rk, 0);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR || c.err || c.all_down)
            break;
    }
    if (c.err == RD_KAFKA_RESP_ERR__AUTHENTICATION) {
        charged_error_set(err,
                          "Kafka refused the SASL credentials of KAFKA_SASL_USERNAME "
                          "'%s': %s",
                          kafka_setup_pass_through(cfg, "sasl.username")
                              ? kafka_setup_pass_through(cfg, "sasl.username")
                              : "",
                          c.reason);
        rc = CHARGED_GIVE_UP;
    } else if (c.err) {
        const char *ca = kafka_setup_pass_through(cfg, "ssl.ca.location");
        charged_error_set(err,
                          "Kafka's TLS certificate does not verify against "
                          "KAFKA_SSL_CA_LOCATION (%s): %s",
                          ca ? ca : "not set: the system's CAs", c.reason);
        rc = CHARGED_GIVE_UP;
    }
    rd_kafka_destroy(rk);
    return rc;
}

void kafka_setup_apply_env(rd_kafka_conf_t *conf, const config_t *cfg)
{
    char err[256];
    for (size_t i = 0; i < config_kafka_count(cfg); i++) {
        const char *p, *v;
        config_kafka_get(cfg, i, &p, &v);
        if (rd_kafka_conf_set(conf, p, v, err, sizeof(err)) != RD_KAFKA_CONF_OK)
            log_warn("kafka property ignored", "property", p, NULL);
    }
}

const char *kafka_setup_pass_through(const config_t *cfg, const char *property)
{
    const char *found = NULL;
    for (size_t i = 0; i < config_kafka_count(cfg); i++) {
        const char *p, *v;
        config_kafka_get(cfg, i, &p, &v);
        if (!strcmp(p, property))
            found = v;
    }
    return found;
}

int kafka_setup_uses_consumer_protocol(const config_t *cfg)
{
    const char *protocol = kafka_setup_pass_through(cfg, "group.protocol");
    return protocol && !strcasecmp(protocol, "consumer"); /* librdkafka ignores case */
}

/* Kafka's rule for group instance ids (the same as for topic names). */
static int valid_instance_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 249 || !strcmp(s, ".") || !strcmp(s, ".."))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') &&
            !(c >= '0' && c <= '9') && c != '.' && c != '_' && c != '-')
            return 0;
    }
    return 1;
}

enum charged_rc kafka_setup_group_instance(rd_kafka_conf_t *conf, const config_t *cfg,
                                           char *out, size_t out_size,
                                           struct charged_error *err)
{
    const char *id = kafka_setup_pass_through(cfg, "group.instance.id");
    const char *var = "KAFKA_GROUP_INSTANCE_ID";
    if (!id) {
        id = config_str(cfg, CONFIG_POD_NAME);
        var = "POD_NAME";
        if (!id || !*id) {
            snprintf(out, out_size, "%s", "");
            return CHARGED_OK;
        }
    }
    if (!valid_instance_id(id)) {
        charged_error_set(
            err,
            "%s: '%s' is not a valid group instance id (1 to 249 characters of "
            "[A-Za-z0-9._-])",
            var, id);
        return CHARGED_GIVE_UP;
    }
    if (kafka_setup_set(conf, "group.instance.id", id, err) != 0)
        return CHARGED_GIVE_UP;
    snprintf(out, out_size, "%s", id);
    return CHARGED_OK;
}

void kafka_setup_worker_id(const config_t *cfg, char *out, size_t out_size)
{
    const char *id = config_str(cfg, CONFIG_WORKER_ID);
    char host[64] = "host", rnd[37];
    uuid_t u;
    if (id && *id) {
        snprintf(out, out_size, "%s", id);
        return;
    }
    gethostname(host, sizeof(host) - 1);
    uuid_generate_random(u);
    uuid_unparse_lower(u, rnd);
    rnd[8] = '\0';
    snprintf(out, out_size, "%s-%d-%s", host, (int)getpid(), rnd);
}
