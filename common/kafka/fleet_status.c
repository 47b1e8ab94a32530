#include "fleet_status.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <librdkafka/rdkafka.h>

#include "clock.h"
#include "kafka_setup.h"

#define BREAKER_METRIC "charged_provider_breaker_state"
/* A worker's /metrics is a few KiB; more is not a worker's. */
#define MAX_METRICS_BODY (1024 * 1024)
/* The longest sample value read: anything longer is no 0, 1 or 2. */
#define MAX_VALUE_LEN 32

/* ---- consumer lag ----
 *
 * A plain consumer handle rather than the Admin API's
 * ListConsumerGroupOffsets: the Admin API would still need a second,
 * asynchronous request (ListOffsets) for the ends, each with its own event
 * queue, where rd_kafka_committed and rd_kafka_query_watermark_offsets are
 * three synchronous calls with timeouts, made as chargectl's dlq reader
 * makes its consumer. The handle never subscribes or assigns, so it never
 * joins the group; without auto commit it has nothing to commit. */

/* Milliseconds left before deadline, 0 when it has passed. */
static int left_ms(int64_t deadline)
{
    int64_t r = deadline - clock_now_ms();
    return r > 0 ? (int)r : 0;
}

/* "all brokers are down" and the like: the caller hears of them from
 * err, and librdkafka's default logs each, many times a second, for as
 * long as the console's overview waits. */
static void on_error(rd_kafka_t *rk, int code, const char *reason, void *opaque)
{
    (void)rk;
    (void)code;
    (void)reason;
    (void)opaque;
}

static rd_kafka_t *lag_consumer(const config_t *cfg, const char *group,
                                struct charged_error *err)
{
    rd_kafka_conf_t *conf = kafka_setup_conf(cfg, "charged-fleet-status", err);
    if (!conf)
        return NULL;
    kafka_setup_apply_env(conf, cfg);
    /* The group's id is what rd_kafka_committed asks the coordinator for;
     * after the pass-through, so that no KAFKA_* turns commits back on. */
    if (kafka_setup_set(conf, "group.id", group, err) ||
        kafka_setup_set(conf, "enable.auto.commit", "false", err) ||
        kafka_setup_set(conf, "enable.auto.offset.store", "false", err)) {
        rd_kafka_conf_destroy(conf);
        return NULL;
    }
    rd_kafka_conf_set_error_cb(conf, on_error);
    char rderr[sizeof(err->message)];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, rderr, sizeof(rderr));
    if (!rk) {
        charged_error_set(err, "%s", rderr);
        rd_kafka_conf_destroy(conf);
    }
    return rk;
}

/* The topic's partition count, or -1 with err. */
static int topic_partitions(rd_kafka_t *rk, const config_t *cfg, const char *topic,
                            int64_t deadline, struct charged_error *err)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
    int n = -1;
    if (!t) {
        charged_error_set(err, "topic '%s': %s", topic,
                          rd_kafka_err2str(rd_kafka_last_error()));
        return -1;
    }
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, t, &md, left_ms(deadline));
    if (e) {
        charged_error_set(err, "kafka unreachable at %s: %s",
                          config_str(cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS),
                          rd_kafka_err2str(e));
    } else if (md->topic_cnt < 1 ||
               md->topics[0].err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) {
        charged_error_set(err, "topic '%s' does not exist", topic);
    } else if (md->topics[0].err) {
        charged_error_set(err, "topic '%s': %s", topic,
                          rd_kafka_err2str(md->topics[0].err));
    } else if (md->topics[0].partition_cnt < 1) {
        charged_error_set(err, "topic '%s' does not exist", topic);
    } else {
        n = md->topics[0].partition_cnt;
    }
    if (md)
        rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(t);
    return n;
}

/* One partition's {partition, committed, end, lag}; committed is null when
 * the group has none there (the lag then counts from the low watermark). */
static json_t *partition_lag(rd_kafka_t *rk, const char *topic,
                             const rd_kafka_topic_partition_t *c, int64_t deadline,
                             json_int_t *lag, struct charged_error *err)
{
    int64_t lo = 0, hi = 0;
    if (c->err) {
        charged_error_set(err, "committed offset of %s [%d]: %s", topic,
                          (int)c->partition, rd_kafka_err2str(c->err));
        return NULL;
    }
    int ms = left_ms(deadline);
    rd_kafka_resp_err_t e =
        ms ? rd_kafka_query_watermark_offsets(rk, topic, c->partition, &lo, &hi, ms)
           : RD_KAFKA_RESP_ERR__TIMED_OUT;
    if (e) {
        charged_error_set(err, "end offset of %s [%d]: %s", topic, (int)c->partition,
                          rd_kafka_err2str(e));
        return NULL;
    }
    int64_t from = c->offset >= 0 ? c->offset : lo;
    /* A committed offset past the end (a topic deleted and made again)
     * is no backlog. */
    *lag = hi > from ? (json_int_t)(hi - from) : 0;
    json_t *committed = c->offset >= 0 ? json_integer(c->offset) : json_null();
    return json_pack("{s:i, s:o, s:I, s:I}", "partition", (int)c->partition,
                     "committed", committed, "end", (json_int_t)hi, "lag", *lag);
}

json_t *fleet_status_lag(const config_t *cfg, const char *group, const char *topic,
                         int timeout_ms, struct charged_error *err)
{
    int64_t deadline = clock_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    rd_kafka_topic_partition_list_t *list = NULL;
    json_t *out = NULL, *parts = NULL;
    json_int_t total = 0;
    charged_error_clear(err);
    if (!group || !*group || !topic || !*topic) {
        charged_error_set(err, "a consumer group and a topic are needed");
        return NULL;
    }
    rd_kafka_t *rk = lag_consumer(cfg, group, err);
    if (!rk)
        return NULL;
    int n = topic_partitions(rk, cfg, topic, deadline, err);
    if (n < 0)
        goto out;
    list = rd_kafka_topic_partition_list_new(n);
    for (int p = 0; p < n; p++)
        rd_kafka_topic_partition_list_add(list, topic, p);
    int ms = left_ms(deadline);
    rd_kafka_resp_err_t e =
        ms ? rd_kafka_committed(rk, list, ms) : RD_KAFKA_RESP_ERR__TIMED_OUT;
    if (e) {
        charged_error_set(err, "committed offsets of group '%s': %s", group,
                          rd_kafka_err2str(e));
        goto out;
    }
    if (!(parts = json_array())) {
        charged_error_set(err, "out of memory");
        goto out;
    }
    for (int i = 0; i < list->cnt; i++) {
        json_int_t lag = 0;
        json_t *p = partition_lag(rk, topic, &list->elems[i], deadline, &lag, err);
        if (!p || json_array_append_new(parts, p)) {
            if (!err->message[0])
                charged_error_set(err, "out of memory");
            goto out;
        }
        total += lag;
    }
    out = json_pack("{s:s, s:s, s:I, s:O}", "group", group, "topic", topic, "total",
                    total, "partitions", parts);
    if (!out)
        charged_error_set(err, "out of memory");
out:
    json_decref(parts);
    if (list)
        rd_kafka_topic_partition_list_destroy(list);
    /* Never subscribed, nothing to leave or commit: consumer_close would
     * only wait on the group coordinator, which may be what did not
     * answer. */
    rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
    return out;
}

/* ---- breakers ---- */

static int is_blank(char c)
{
    return c == ' ' || c == '\t';
}

/* A sample value that is a plain decimal number, [+-]d[.d][e[+-]d]: no
 * hex, inf or nan for strtod to read. */
static int plain_number(const char *s, size_t n)
{
    size_t i = 0, digits = 0;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
        digits++;
    if (i < n && s[i] == '.')
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            digits++;
    if (!digits)
        return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t exp = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
            exp++;
        if (!exp)
            return 0;
    }
    return i == n;
}

/* One line's breaker state, or -1 when the line is no valid sample of it:
 * name, optional {labels}, value, optional timestamp. */
static int parse_line(const char *s, size_t n)
{
    const size_t name_len = sizeof(BREAKER_METRIC) - 1;
    size_t i = 0;
    while (i < n && is_blank(s[i]))
        i++;
    if (n - i < name_len || memcmp(s + i, BREAKER_METRIC, name_len))
        return -1;
    i += name_len;
    if (i < n && s[i] == '{') {
        /* A label value may hold '}' inside its quotes, or an escaped quote. */
        int quoted = 0;
        for (i++; i < n; i++) {
            if (quoted && s[i] == '\\')
                i++;
            else if (s[i] == '"')
                quoted = !quoted;
            else if (!quoted && s[i] == '}')
                break;
        }
        if (i >= n)
            return -1;
        i++;
    }
    /* The name ends here: not charged_provider_breaker_state_other. */
    if (i >= n || !is_blank(s[i]))
        return -1;
    while (i < n && is_blank(s[i]))
        i++;
    size_t start = i;
    while (i < n && !is_blank(s[i]))
        i++;
    size_t vlen = i - start;
    if (!vlen || vlen >= MAX_VALUE_LEN || !plain_number(s + start, vlen))
        return -1;
    while (i < n && is_blank(s[i]))
        i++;
    if (i < n) { /* a timestamp, and nothing after it */
        size_t ts = i;
        if (s[i] == '-')
            i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == ts)
            return -1;
        while (i < n && is_blank(s[i]))
            i++;
        if (i < n)
            return -1;
    }
    char v[MAX_VALUE_LEN];
    memcpy(v, s + start, vlen);
    v[vlen] = '\0';
    errno = 0;
    double d = strtod(v, NULL);
    if (errno == ERANGE) /* 1e-400 is no 0, 1e400 no state */
        return -1;
    return d == 0.0 ? 0 : d == 1.0 ? 1 : d == 2.0 ? 2 : -1;
}

int fleet_status_parse_breaker(const char *body, size_t len)
{
    int worst = -1;
    if (!body)
        return -1;
    /* Several samples (one per label set): the worst one is the worker's. */
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(body + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - body) : len, n = end - i;
        if (n && body[i + n - 1] == '\r')
            n--;
        int s = parse_line(body + i, n); /* a '#' line never matches the name */
        if (s > worst)
            worst = s;
        i = end + 1;
    }
    return worst;
}

/* One worker's metrics URL and its request. */
struct probe {
    char *url;             /* as given, user information included (curl sends it) */
    char *shown;           /* what the answer says: no user information */
    char *user, *password; /* curl's, to be freed with curl_free */
    const char *refused;   /* why it is not requested, or NULL */
    CURL *easy;
    CURLcode result;
    int done;
    char *body;
    size_t len;
    int over; /* the body passed MAX_METRICS_BODY */
    char errbuf[CURL_ERROR_SIZE];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *opaque)
{
    struct probe *p = opaque;
    size_t n = size * nmemb;
    if (n > MAX_METRICS_BODY - p->len) {
        p->over = 1;
        return 0; /* curl stops: CURLE_WRITE_ERROR */
    }
    char *b = realloc(p->body, p->len + n + 1);
    if (!b)
        return 0;
    memcpy(b + p->len, data, n);
    p->body = b;
    p->len += n;
    b[p->len] = '\0';
    return n;
}

/* s with the bytes [skip, skip_end) left out and every byte outside
 * printable ASCII percent-encoded: the answer is JSON, read by people. */
static char *printable(const char *s, size_t skip, size_t skip_end)
{
    size_t len = strlen(s);
    char *out = malloc(3 * len + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= skip && i < skip_end)
            continue;
        if (c <= 0x20 || c >= 0x7f)
            o += sprintf(o, "%%%02X", c);
        else
            *o++ = (char)c;
    }
    *o = '\0';
    return out;
}

/* What curl does not read as a URL, shown: everything between "://" and
 * the last '@' before any '?' or '#' goes, whatever the '/' between (the
 * authority of a URL that does not parse is anyone's guess). */
static char *printable_unparsed(const char *url)
{
    const char *sep = strstr(url, "://");
    size_t start = sep ? (size_t)(sep - url) + 3 : 0;
    size_t end = start + strcspn(url + start, "?#"), at = start;
    for (size_t i = start; i < end; i++)
        if (url[i] == '@')
            at = i + 1;
    return printable(url, start, at);
}

/* Reads p->url as curl does: whether it is requested (http or https
 * only), what the answer shows (curl's own URL without user, password and
 * login options) and the login (to keep it out of any error). -1 when out
 * of memory. */
static int probe_url(struct probe *p)
{
    char *scheme = NULL, *clean = NULL;
    int rc = 0;
    CURLU *u = curl_url();
    if (!u)
        return -1;
    p->refused = "not an http(s) URL";
    if (curl_url_set(u, CURLUPART_URL, p->url, CURLU_NON_SUPPORT_SCHEME) != CURLUE_OK) {
        p->shown = printable_unparsed(p->url);
        goto out;
    }
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        (!strcasecmp(scheme, "http") || !strcasecmp(scheme, "https")))
        p->refused = NULL;
    curl_url_get(u, CURLUPART_USER, &p->user, 0);
    curl_url_get(u, CURLUPART_PASSWORD, &p->password, 0);
    curl_url_set(u, CURLUPART_USER, NULL, 0);
    curl_url_set(u, CURLUPART_PASSWORD, NULL, 0);
    curl_url_set(u, CURLUPART_OPTIONS, NULL, 0);
    if (curl_url_get(u, CURLUPART_URL, &clean, 0) == CURLUE_OK)
        p->shown = printable(clean, 0, 0);
    else
        p->shown = printable_unparsed(p->url);
out:
    if (!p->shown)
        rc = -1;
    curl_free(clean);
    curl_free(scheme);
    curl_url_cleanup(u);
    return rc;
}

/* 1 when msg quotes the URL's user or password. */
static int quotes_login(const struct probe *p, const char *msg)
{
    return (p->user && *p->user && strstr(msg, p->user)) ||
           (p->password && *p->password && strstr(msg, p->password));
}

static int probe_start(struct probe *p, CURLM *multi, int timeout_ms)
{
    if (!(p->easy = curl_easy_init()))
        return -1;
    CURL *e = p->easy;
    curl_easy_setopt(e, CURLOPT_URL, p->url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, p);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, p->errbuf);
    curl_easy_setopt(e, CURLOPT_PRIVATE, p);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "charged/1");
    /* A compressed body would pass the cap only once unpacked. */
    curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, NULL);
    if (curl_multi_add_handle(multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        p->easy = NULL;
        return -1;
    }
    return 0;
}

/* Runs every started request to its end; each is bounded by its own
 * timeout, the loop by all of them at once. */
static void probes_run(CURLM *multi, int timeout_ms)
{
    int64_t deadline = clock_now_ms() + timeout_ms + 1000;
    int running = 1;
    while (running && clock_now_ms() < deadline) {
        if (curl_multi_perform(multi, &running) != CURLM_OK)
            break;
        CURLMsg *m;
        int queued;
        while ((m = curl_multi_info_read(multi, &queued))) {
            struct probe *p = NULL;
            if (m->msg != CURLMSG_DONE)
                continue;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&p);
            if (p) {
                p->done = 1;
                p->result = m->data.result;
            }
        }
        if (running)
            curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
}

static int set_string(json_t *o, const char *key, const char *s, const char *fallback)
{
    json_t *v = s ? json_string(s) : json_null();
    if (!v && fallback) /* not UTF-8 */
        v = json_string(fallback);
    return json_object_set_new(o, key, v);
}

static const char *state_name(int s)
{
    return s == 0 ? "closed" : s == 1 ? "half_open" : "open";
}

/* The answer's entry of one probe: "error" is null when the state was
 * read, and says why otherwise (the state is then "unreachable"). */
static json_t *probe_json(struct probe *p)
{
    const char *state = "unreachable", *error = NULL, *fallback = NULL;
    char why[96];
    long status = 0;
    if (p->refused) {
        error = p->refused;
    } else if (!p->easy) {
        error = "out of memory";
    } else if (!p->done) {
        error = "no answer in time";
    } else if (p->over) {
        error = "metrics body over 1 MiB";
    } else if (p->result != CURLE_OK) {
        fallback = curl_easy_strerror(p->result);
        error = p->errbuf[0] ? p->errbuf : fallback;
        /* curl's message names the host, not the login; should one ever
         * quote the URL, its own words say enough. */
        if (quotes_login(p, error))
            error = fallback;
    } else if (curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &status),
               status != 200) {
        snprintf(why, sizeof(why), "HTTP %ld", status);
        error = why;
    } else {
        int s = fleet_status_parse_breaker(p->body, p->len);
        if (s < 0)
            error = "no " BREAKER_METRIC " in the metrics";
        else
            state = state_name(s);
    }
    json_t *o = json_object();
    if (!o || set_string(o, "url", p->shown, NULL) ||
        set_string(o, "state", state, NULL) ||
        set_string(o, "error", error, fallback ? fallback : "unreadable error")) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void probes_free(struct probe *probes, size_t n, CURLM *multi)
{
    for (size_t i = 0; i < n; i++) {
        struct probe *p = &probes[i];
        if (p->easy) {
            if (multi)
                curl_multi_remove_handle(multi, p->easy);
            curl_easy_cleanup(p->easy);
        }
        free(p->url);
        free(p->shown);
        curl_free(p->user);
        curl_free(p->password);
        free(p->body);
    }
    free(probes);
}

/* Splits the comma-separated list into probes (blank entries skipped).
 * NULL when out of memory. */
static struct probe *probes_parse(const char *urls, size_t *count)
{
    size_t cap = 1, n = 0;
    for (const char *c = urls; *c; c++)
        cap += *c == ',';
    struct probe *probes = calloc(cap, sizeof(*probes));
    if (!probes)
        return NULL;
    for (const char *s = urls;; s++) {
        size_t len = strcspn(s, ",");
        const char *b = s, *e = s + len;
        while (b < e && is_blank(*b))
            b++;
        while (e > b && is_blank(e[-1]))
            e--;
        if (e > b) {
            struct probe *p = &probes[n++];
            if (!(p->url = strndup(b, (size_t)(e - b)))) {
                probes_free(probes, n, NULL);
                return NULL;
            }
            if (probe_url(p)) {
                probes_free(probes, n, NULL);
                return NULL;
            }
        }
        s += len;
        if (!*s)
            break;
    }
    *count = n;
    return probes;
}

json_t *fleet_status_breakers(const char *urls, int timeout_ms)
{
    json_t *out = json_array();
    size_t n = 0;
    if (!out || !urls || !*urls)
        return out;
    if (timeout_ms < 1)
        timeout_ms = 1; /* curl reads 0 as no timeout at all */
    pthread_once(&curl_once, curl_init_once);
    struct probe *probes = probes_parse(urls, &n);
    CURLM *multi = probes ? curl_multi_init() : NULL;
    int ok = multi != NULL;
    if (ok) {
        for (size_t i = 0; i < n; i++)
            if (!probes[i].refused)
                probe_start(&probes[i], multi, timeout_ms);
        probes_run(multi, timeout_ms);
    }
    for (size_t i = 0; ok && i < n; i++) {
        json_t *o = probe_json(&probes[i]);
        ok = o && !json_array_append_new(out, o);
    }
    if (probes)
        probes_free(probes, n, multi);
    if (multi)
        curl_multi_cleanup(multi);
    if (!ok) { /* out of memory */
        json_decref(out);
        out = NULL;
    }
    return out;
}
