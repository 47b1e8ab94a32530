#include "kafka_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int kafka_setup_set(rd_kafka_conf_t *conf, const char *name, const char *value,
                    char *errbuf, size_t errbuf_size)
{
    if (rd_kafka_conf_set(conf, name, value, errbuf, errbuf_size) != RD_KAFKA_CONF_OK)
        return -1;
    return 0;
}

rd_kafka_conf_t *kafka_setup_conf(const config_t *cfg, const char *client_id,
                                  char *errbuf, size_t errbuf_size)
{
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (kafka_setup_set(conf, "bootstrap.servers",
                        config_str(cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS), errbuf,
                        errbuf_size) ||
        kafka_setup_set(conf, "client.id", client_id, errbuf, errbuf_size)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set_log_cb(conf, on_log);
    return conf;
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
