#include "budget_lease.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uuid/uuid.h>

#include "charged_assert.h"
#include "store_conn.h"

/* The held array: global, the classes, the floor. */
#define HELD_N   (2 + BUDGET_CLASS_COUNT)
#define DEMAND_N (BUDGET_PRIO_COUNT * BUDGET_CLASS_COUNT)
/* Room for a bigint array's text. */
#define ARRAY_TEXT (DEMAND_N * 24 + 4)
/* A change asked while refreshes hold the lock: tried this often. */
#define SET_TRIES 5

/* A rotation lasts whole leases: see BUDGET_ROTATE_MS. */
_Static_assert(BUDGET_ROTATE_MS % BUDGET_LEASE_MS == 0, "a rotation is whole leases");

struct budget_lease {
    store_conn_t *db;
    char account[BUDGET_NAME_MAX + 1], role[BUDGET_NAME_MAX + 1];
    char host[256], member[37];
    long long lease_ms;
    int pid;
};

/* The settings columns, in budget_settings' order. */
#define SETTINGS_COLUMNS                                                               \
    "global_rps, create_rps, capture_rps, refund_rps, retrieve_rps, search_rps, "      \
    "list_rps, audit_floor_rps"
#define SETTINGS_NCOLS 8

/* One settings row as the JSON that show, set and the change history
 * print (b: the row's alias). */
#define SETTINGS_JSON(b)                                                               \
    "json_build_object('account', " b ".account, 'global_rps', " b ".global_rps,"      \
    " 'classes', json_build_object('create', " b ".create_rps, 'capture', " b          \
    ".capture_rps, 'refund', " b ".refund_rps, 'retrieve', " b ".retrieve_rps,"        \
    " 'search', " b ".search_rps, 'list', " b ".list_rps),"                            \
    " 'audit_floor_rps', " b ".audit_floor_rps, 'version', " b ".version,"             \
    " 'updated_by', " b ".updated_by, 'updated_at', to_char(" b                        \
    ".updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'))"

static int name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > BUDGET_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

budget_lease_t *budget_lease_new(const char *database_url, const char *account,
                                 const char *role, long long lease_ms,
                                 struct charged_error *err)
{
    uuid_t id;
    budget_lease_t *l;
    charged_error_clear(err);
    CHARGED_ASSERT(database_url != NULL);
    if (!name_ok(account) || !name_ok(role) || lease_ms <= 0 ||
        lease_ms > BUDGET_LEASE_MAX_MS) {
        charged_error_set(err,
                          "budget: the account and role must be 1..%d bytes of text, "
                          "the lease 1..%d ms",
                          BUDGET_NAME_MAX, BUDGET_LEASE_MAX_MS);
        return NULL;
    }
    if (!(l = calloc(1, sizeof(*l)))) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    if (!(l->db = store_conn_new(database_url, BUDGET_LOCK_TIMEOUT, err))) {
        free(l);
        return NULL;
    }
    snprintf(l->account, sizeof(l->account), "%s", account);
    snprintf(l->role, sizeof(l->role), "%s", role);
    if (gethostname(l->host, sizeof(l->host) - 1) != 0 || !l->host[0])
        snprintf(l->host, sizeof(l->host), "unknown");
    uuid_generate_random(id);
    uuid_unparse_lower(id, l->member);
    l->lease_ms = lease_ms;
    l->pid = (int)getpid();
    return l;
}

void budget_lease_free(budget_lease_t *l)
{
    if (!l)
        return;
    store_conn_free(l->db);
    free(l);
}

const char *budget_lease_member(const budget_lease_t *l)
{
    CHARGED_ASSERT(l != NULL);
    return l->member;
}

/* A statement outside a transaction, or a transaction's BEGIN: on a
 * session opened if need be, asked once more on a new one when the server
 * had closed it while idle (as every store's). */
static enum charged_rc run(budget_lease_t *l, const char *sql, int n,
                           const char *const *p, PGresult **res,
                           struct charged_error *err)
{
    enum charged_rc rc;
    if (res)
        *res = NULL;
    if ((rc = store_conn_open(l->db, NULL, err)) != CHARGED_OK)
        return rc;
    rc = store_conn_exec(l->db, sql, n, p, res, err);
    if (rc != CHARGED_OK && store_conn_broken(l->db) &&
        store_conn_open(l->db, NULL, err) == CHARGED_OK)
        rc = store_conn_exec(l->db, sql, n, p, res, err);
    return rc;
}

/* BEGIN of a transaction that will lock the settings row, bounded so that
 * a stall of this process cannot hold the lock hostage: the server ends the
 * transaction (and the session) once it sits idle in it for
 * BUDGET_IDLE_IN_TX, and a statement of it after BUDGET_STATEMENT_TIMEOUT
 * (both local to the transaction). */
static enum charged_rc begin_bounded(budget_lease_t *l, struct charged_error *err)
{
    const char *p[2] = {BUDGET_IDLE_IN_TX, BUDGET_STATEMENT_TIMEOUT};
    CHARGED_ASSERT(l != NULL && err != NULL);
    enum charged_rc rc = run(l, "BEGIN", 0, NULL, NULL, err);
    if (rc != CHARGED_OK)
        return rc;
    rc = store_conn_exec(l->db,
                         "SELECT set_config('idle_in_transaction_session_timeout', $1,"
                         " true), set_config('statement_timeout', $2, true)",
                         2, p, NULL, err);
    if (rc != CHARGED_OK) {
        struct charged_error ignore;
        store_conn_exec(l->db, "ROLLBACK", 0, NULL, NULL, &ignore);
    }
    return rc;
}

/* Ends the transaction: COMMIT after rc CHARGED_OK, else ROLLBACK (its own
 * failure ignored: the session's end rolls back too). */
static enum charged_rc tx_end(budget_lease_t *l, enum charged_rc rc,
                              struct charged_error *err)
{
    struct charged_error ignore;
    if (rc == CHARGED_OK)
        return store_conn_exec(l->db, "COMMIT", 0, NULL, NULL, err);
    store_conn_exec(l->db, "ROLLBACK", 0, NULL, NULL, &ignore);
    return rc;
}

/* Parses a bigint array's elements as array_to_string(a, ',') gives them
 * ("1,2,-1": whatever the array's bounds or dimensions, which a row no
 * member wrote may have made other than 0020's) into exactly n values. */
static int parse_list(const char *s, long long *out, int n)
{
    char *end;
    for (int i = 0; i < n; i++) {
        out[i] = strtoll(s, &end, 10);
        if (end == s || *end != (i + 1 < n ? ',' : '\0'))
            return -1;
        s = end + 1;
    }
    return 0;
}

static void format_array(const long long *v, int n, char *out, size_t size)
{
    size_t used = 0;
    for (int i = 0; i < n && used < size; i++)
        used +=
            (size_t)snprintf(out + used, size - used, "%c%lld", i ? ',' : '{', v[i]);
    if (used < size)
        snprintf(out + used, size - used, "}");
}

static void held_to_array(const struct budget_share *s, long long v[HELD_N])
{
    v[0] = s->global_mrps;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        v[1 + c] = s->class_mrps[c];
    v[HELD_N - 1] = s->floor_mrps;
}

static void held_from_array(const long long v[HELD_N], struct budget_share *s)
{
    s->global_mrps = v[0];
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        s->class_mrps[c] = v[1 + c];
    s->floor_mrps = v[HELD_N - 1];
}

/* Locks the settings row and reads it; *missing when there is none. */
static enum charged_rc lock_settings(budget_lease_t *l, struct budget_settings *s,
                                     long long *version, long long *db_ms, int *missing,
                                     struct charged_error *err)
{
    const char *p[1] = {l->account};
    PGresult *r = NULL;
    enum charged_rc rc = store_conn_exec(
        l->db,
        "SELECT " SETTINGS_COLUMNS ", version,"
        " floor(extract(epoch FROM now()) * 1000)::bigint FROM provider_budget"
        " WHERE account = $1 FOR UPDATE",
        1, p, &r, err);
    if (rc != CHARGED_OK)
        goto out;
    *missing = PQntuples(r) == 0;
    if (*missing)
        goto out;
    s->global_rps = atoll(PQgetvalue(r, 0, 0));
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        s->class_rps[c] = atoll(PQgetvalue(r, 0, 1 + c));
    s->audit_floor_rps = atoll(PQgetvalue(r, 0, SETTINGS_NCOLS - 1));
    *version = atoll(PQgetvalue(r, 0, SETTINGS_NCOLS));
    *db_ms = atoll(PQgetvalue(r, 0, SETTINGS_NCOLS + 1));
out:
    PQclear(r);
    return rc;
}

/* A share that holds each whole limit (after budget_share_bound). */
static void share_whole(const struct budget_settings *s, struct budget_share *one)
{
    one->global_mrps = one->floor_mrps = BUDGET_UNLIMITED;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        one->class_mrps[c] = BUDGET_UNLIMITED;
    budget_share_bound(s, one);
}

/* The other live members' ids and demands (into members[0..*n)), the sum
 * of their shares, each bounded to what a member can hold under s (a row is
 * not trusted: budget_share_bound), and the earliest of their lease ends
 * (ms from now(), the transaction's start; -1 none). members has room for
 * the rows plus this member's.
 *
 * No row's content can fail the refresh (which would leave the rows that
 * made it unbounded, and the fleet stopped for good): times are read
 * bounded to BUDGET_LEASE_MAX_MS (an 'infinity' cannot be subtracted),
 * arrays by their elements whatever their bounds; a row still unreadable
 * counts as holding each whole limit and asking nothing. At most
 * BUDGET_MEMBERS_MAX - 1 rows are read, the most recently written first:
 * xmin is the writing transaction's, which no row's writer chooses, and a
 * live member rewrites its row every refresh, so rows written once and
 * left cannot push the members out of the allocation (member_id breaks
 * ties, as every member sees them alike). Rows beyond those count as
 * holding each whole limit: this member takes nothing more until they end
 * (write_member bounds their lease), never more than the limits allow. */
static enum charged_rc read_others(budget_lease_t *l, const struct budget_settings *s,
                                   struct budget_member_view **members, size_t *n,
                                   struct budget_share *others, long long *end_in_ms,
                                   struct budget_refresh *out,
                                   struct charged_error *err)
{
    char max[24], most[24];
    const char *p[4] = {l->account, l->member, max, most};
    PGresult *r = NULL;
    long long held[HELD_N], total;
    snprintf(max, sizeof(max), "%d", BUDGET_LEASE_MAX_MS);
    snprintf(most, sizeof(most), "%d", BUDGET_MEMBERS_MAX - 1);
    enum charged_rc rc = store_conn_exec(
        l->db,
        "SELECT array_to_string(demand_mrps, ','), array_to_string(held_mrps, ','),"
        " ceil(extract(epoch FROM least(expires_at, statement_timestamp()"
        " + $3::bigint * interval '1 millisecond') - now()) * 1000)::bigint,"
        " member_id::text, count(*) OVER ()"
        " FROM provider_budget_members"
        " WHERE account = $1 AND member_id <> $2::uuid AND expires_at > now()"
        " ORDER BY age(xmin), member_id LIMIT $4::int",
        4, p, &r, err);
    if (rc != CHARGED_OK)
        goto out;
    *n = (size_t)PQntuples(r);
    *end_in_ms = -1;
    budget_share_zero(others);
    if (!(*members = calloc(*n + 1, sizeof(**members)))) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
        goto out;
    }
    total = *n ? atoll(PQgetvalue(r, 0, 4)) : 0;
    for (size_t i = 0; i < *n; i++) {
        struct budget_share one;
        struct budget_member_view *v = &(*members)[i];
        snprintf(v->id, sizeof(v->id), "%s", PQgetvalue(r, (int)i, 3));
        if (parse_list(PQgetvalue(r, (int)i, 0), &v->demand.mrps[0][0], DEMAND_N) ||
            parse_list(PQgetvalue(r, (int)i, 1), held, HELD_N)) {
            memset(&v->demand, 0, sizeof(v->demand));
            share_whole(s, &one);
            out->rows_unreadable++;
        } else {
            held_from_array(held, &one);
            budget_share_bound(s, &one);
        }
        budget_demand_bound(&v->demand);
        long long end = strtoll(PQgetvalue(r, (int)i, 2), NULL, 10);
        if (end > BUDGET_LEASE_MAX_MS) /* a row no member wrote: bounded */
            end = BUDGET_LEASE_MAX_MS;
        if (*end_in_ms < 0 || end < *end_in_ms)
            *end_in_ms = end;
        budget_share_add(others, &one);
    }
    if (total > (long long)*n) {
        struct budget_share rest;
        share_whole(s, &rest);
        budget_share_add(others, &rest);
        out->rows_unread = (int)(total - (long long)*n);
    }
out:
    PQclear(r);
    return rc;
}

/* Writes this member's demand, share and lease, bounds every other lease
 * to BUDGET_LEASE_MAX_MS from now (no member writes a longer one: a row
 * that says so was not written by one; statement_timestamp(), not now():
 * a member that committed while this transaction waited for the lock wrote
 * its now() + lease, later than this one's now() + lease) and deletes the
 * members whose lease ended (one statement). */
static enum charged_rc write_member(budget_lease_t *l,
                                    const struct budget_demand *demand,
                                    const struct budget_share *held, long long version,
                                    int *bounded, struct charged_error *err)
{
    PGresult *r = NULL;
    char pid[16], dem[ARRAY_TEXT], hel[ARRAY_TEXT], ver[24], lease[24], max[24];
    long long h[HELD_N];
    const char *p[10] = {l->account, l->member, l->role, pid,   l->host,
                         dem,        hel,       ver,     lease, max};
    snprintf(pid, sizeof(pid), "%d", l->pid);
    format_array(&demand->mrps[0][0], DEMAND_N, dem, sizeof(dem));
    held_to_array(held, h);
    format_array(h, HELD_N, hel, sizeof(hel));
    snprintf(ver, sizeof(ver), "%lld", version);
    snprintf(lease, sizeof(lease), "%lld", l->lease_ms);
    snprintf(max, sizeof(max), "%d", BUDGET_LEASE_MAX_MS);
    enum charged_rc rc = store_conn_exec(
        l->db,
        "WITH gone AS (DELETE FROM provider_budget_members WHERE account = $1"
        " AND expires_at <= now() AND member_id <> $2::uuid),"
        " bounded AS (UPDATE provider_budget_members SET"
        " expires_at = statement_timestamp() + $10::bigint * interval '1 millisecond'"
        " WHERE account = $1 AND member_id <> $2::uuid AND expires_at >"
        " statement_timestamp() + $10::bigint * interval '1 millisecond'"
        " RETURNING 1)"
        " INSERT INTO provider_budget_members (account, member_id, role, pid, host,"
        " demand_mrps, held_mrps, settings_version, expires_at)"
        " VALUES ($1, $2::uuid, $3, $4::int, $5, $6::bigint[], $7::bigint[], "
        "$8::bigint,"
        " now() + $9::bigint * interval '1 millisecond')"
        " ON CONFLICT (account, member_id) DO UPDATE SET"
        " demand_mrps = EXCLUDED.demand_mrps, held_mrps = EXCLUDED.held_mrps,"
        " settings_version = EXCLUDED.settings_version, refreshed_at = now(),"
        " expires_at = EXCLUDED.expires_at RETURNING (SELECT count(*) FROM bounded)",
        10, p, &r, err);
    if (rc == CHARGED_OK)
        *bounded = PQntuples(r) ? atoi(PQgetvalue(r, 0, 0)) : 0;
    PQclear(r);
    return rc;
}

/* One refresh's transaction; *missing (nothing written) when the account
 * has no settings row. */
static enum charged_rc refresh_once(budget_lease_t *l,
                                    const struct budget_demand *demand,
                                    struct budget_refresh *out, int *missing,
                                    struct charged_error *err)
{
    struct budget_member_view *members = NULL;
    struct budget_share others;
    size_t n = 0;
    long long db_ms = 0;
    const char *why;
    enum charged_rc rc;

    if ((rc = begin_bounded(l, err)) != CHARGED_OK)
        return rc;
    if ((rc = lock_settings(l, &out->settings, &out->version, &db_ms, missing, err)) !=
            CHARGED_OK ||
        *missing)
        goto out;
    if ((rc = read_others(l, &out->settings, &members, &n, &others,
                          &out->others_end_in_ms, out, err)) != CHARGED_OK)
        goto out;
    snprintf(members[n].id, sizeof(members[n].id), "%s", l->member);
    members[n].demand = *demand;
    /* The fleet's allocation in the members' id order, rotated by the
     * database's clock, as every member computes it, and this member's row
     * of it: with a place of its own (last) each member would leave the
     * rounding's odd units to another; without the rotation the same ids
     * would get them at every refresh. */
    if (budget_alloc_member_target(&out->settings, members, n + 1, n,
                                   budget_alloc_rotation(db_ms), &out->target,
                                   &why) != 0) {
        charged_error_set(err, "budget: allocation refused: %s", why);
        rc = CHARGED_RETRY; /* our rows or our bug: not the caller's item */
        goto out;
    }
    budget_alloc_take(&out->settings, &out->target, &others, &out->held);
    /* The two-phase rule's promise: others within the limits stay so with
     * what this member takes. */
    struct budget_share sum = others;
    budget_share_add(&sum, &out->held);
    CHARGED_ASSERT(!budget_alloc_within(&out->settings, &others) ||
                   budget_alloc_within(&out->settings, &sum));
    out->members = (int)n + 1;
    out->lease_ms = l->lease_ms;
    rc = write_member(l, demand, &out->held, out->version, &out->leases_bounded, err);
out:
    free(members);
    rc = tx_end(l, *missing && rc == CHARGED_OK ? CHARGED_NOT_FOUND : rc, err);
    return rc == CHARGED_NOT_FOUND ? CHARGED_OK : rc;
}

enum charged_rc budget_lease_refresh(budget_lease_t *l,
                                     const struct budget_demand *demand,
                                     struct budget_refresh *out,
                                     struct charged_error *err)
{
    const char *p[1], *why;
    enum charged_rc rc;
    CHARGED_ASSERT(l != NULL && demand != NULL && out != NULL);
    charged_error_clear(err);
    memset(out, 0, sizeof(*out));
    if (budget_demand_check(demand, &why) != 0) {
        charged_error_set(err, "budget: %s", why);
        return CHARGED_BAD_ITEM;
    }
    for (int tries = 0; tries < 2; tries++) {
        int missing = 0;
        rc = refresh_once(l, demand, out, &missing, err);
        if (rc != CHARGED_OK || !missing)
            return rc;
        p[0] = l->account; /* a new account: its row, no limit */
        if ((rc = run(l,
                      "INSERT INTO provider_budget (account, updated_by) VALUES ($1,"
                      " 'first member') ON CONFLICT (account) DO NOTHING",
                      1, p, NULL, err)) != CHARGED_OK)
            return rc;
    }
    charged_error_set(err, "budget: the settings row of '%s' keeps vanishing",
                      l->account);
    return CHARGED_RETRY;
}

enum charged_rc budget_lease_leave(budget_lease_t *l, struct charged_error *err)
{
    const char *p[2] = {l->account, l->member};
    CHARGED_ASSERT(l != NULL);
    charged_error_clear(err);
    return run(l,
               "DELETE FROM provider_budget_members WHERE account = $1"
               " AND member_id = $2::uuid",
               2, p, NULL, err);
}

/* A JSON value of the answer's row 0, column col, as a new reference. */
static json_t *json_cell(PGresult *r, int col, struct charged_error *err)
{
    json_t *v = json_loads(PQgetvalue(r, 0, col), 0, NULL);
    if (!v)
        charged_error_set(err, "budget: unreadable answer (out of memory?)");
    return v;
}

enum charged_rc budget_lease_show(budget_lease_t *l, json_t **settings,
                                  json_t **members, struct charged_error *err)
{
    const char *p[1] = {l->account};
    PGresult *r = NULL;
    enum charged_rc rc;
    CHARGED_ASSERT(l != NULL && settings != NULL && members != NULL);
    charged_error_clear(err);
    *settings = *members = NULL;
    rc = run(
        l,
        "SELECT " SETTINGS_JSON(
            "b") "::text,"
                 " (SELECT coalesce(json_agg(json_build_object('member_id', "
                 "m.member_id,"
                 " 'role', m.role, 'pid', m.pid, 'host', m.host, 'held_mrps', "
                 "m.held_mrps,"
                 " 'demand_mrps', m.demand_mrps, 'expires_in_ms',"
                 " (extract(epoch FROM least(m.expires_at, now() + interval '1 day')"
                 " - now()) * 1000)::bigint)"
                 " ORDER BY m.joined_at, m.member_id), '[]'::json)"
                 " FROM provider_budget_members m"
                 " WHERE m.account = b.account AND m.expires_at > now())::text"
                 " FROM provider_budget b WHERE b.account = $1",
        1, p, &r, err);
    if (rc != CHARGED_OK)
        goto out;
    if (PQntuples(r) == 0) {
        charged_error_set(err, "no budget settings for account '%s'", l->account);
        rc = CHARGED_NOT_FOUND;
        goto out;
    }
    if (!(*settings = json_cell(r, 0, err)) || !(*members = json_cell(r, 1, err))) {
        json_decref(*settings);
        *settings = NULL;
        rc = CHARGED_RETRY;
    }
out:
    PQclear(r);
    return rc;
}

/* The change applied to the row read (columns 1.. of r, in budget_settings'
 * order). */
static void merge_change(PGresult *r, const struct budget_change *c,
                         struct budget_settings *s)
{
    s->global_rps = c->global ? c->to.global_rps : atoll(PQgetvalue(r, 0, 1));
    for (int k = 0; k < BUDGET_CLASS_COUNT; k++)
        s->class_rps[k] =
            c->cls[k] ? c->to.class_rps[k] : atoll(PQgetvalue(r, 0, 2 + k));
    s->audit_floor_rps = c->audit_floor ? c->to.audit_floor_rps
                                        : atoll(PQgetvalue(r, 0, SETTINGS_NCOLS));
}

/* The UPDATE and its record, after the row was locked and read as r
 * (column 0: the row's JSON, the "before"). */
static enum charged_rc write_change(budget_lease_t *l, PGresult *r,
                                    const struct budget_settings *s, const char *actor,
                                    json_t **after, struct charged_error *err)
{
    char v[SETTINGS_NCOLS][24];
    const char *p[SETTINGS_NCOLS + 3] = {l->account, actor};
    PGresult *u = NULL;
    snprintf(v[0], sizeof(v[0]), "%lld", s->global_rps);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        snprintf(v[1 + c], sizeof(v[1 + c]), "%lld", s->class_rps[c]);
    snprintf(v[SETTINGS_NCOLS - 1], sizeof(v[0]), "%lld", s->audit_floor_rps);
    for (int i = 0; i < SETTINGS_NCOLS; i++)
        p[2 + i] = v[i];
    p[SETTINGS_NCOLS + 2] = PQgetvalue(r, 0, 0);
    enum charged_rc rc = store_conn_exec(
        l->db,
        "WITH up AS (UPDATE provider_budget b SET global_rps = $3::bigint,"
        " create_rps = $4::bigint, capture_rps = $5::bigint, refund_rps = $6::bigint,"
        " retrieve_rps = $7::bigint, search_rps = $8::bigint, list_rps = $9::bigint,"
        " audit_floor_rps = $10::bigint, version = b.version + 1, updated_by = $2,"
        " updated_at = now() WHERE b.account = $1 RETURNING " SETTINGS_JSON(
            "b") " AS j)"
                 " INSERT INTO provider_budget_changes (account, actor, before, after)"
                 " SELECT $1, $2, $11::jsonb, up.j::jsonb FROM up RETURNING "
                 "after::text",
        SETTINGS_NCOLS + 3, p, &u, err);
    if (rc == CHARGED_OK && !(*after = json_cell(u, 0, err)))
        rc = CHARGED_RETRY;
    PQclear(u);
    return rc;
}

/* One try of a change: lock and read the row, merge, check, write. */
static enum charged_rc set_once(budget_lease_t *l, const struct budget_change *change,
                                const char *actor, json_t **after,
                                struct charged_error *err)
{
    const char *p[1] = {l->account}, *why;
    struct budget_settings s;
    PGresult *r = NULL;
    enum charged_rc rc;

    if ((rc = begin_bounded(l, err)) != CHARGED_OK)
        return rc;
    rc = store_conn_exec(
        l->db,
        "SELECT " SETTINGS_JSON(
            "b") "::text, " SETTINGS_COLUMNS
                 " FROM provider_budget b WHERE account = $1 FOR UPDATE",
        1, p, &r, err);
    if (rc != CHARGED_OK)
        goto out;
    if (PQntuples(r) == 0) {
        charged_error_set(err, "no budget settings for account '%s'", l->account);
        rc = CHARGED_NOT_FOUND;
        goto out;
    }
    merge_change(r, change, &s);
    if (budget_settings_check(&s, &why) != 0) {
        charged_error_set(err, "%s", why);
        rc = CHARGED_BAD_ITEM;
        goto out;
    }
    rc = write_change(l, r, &s, actor, after, err);
out:
    PQclear(r);
    return tx_end(l, rc, err);
}

enum charged_rc budget_lease_set(budget_lease_t *l, const struct budget_change *change,
                                 const char *actor, json_t **after,
                                 struct charged_error *err)
{
    enum charged_rc rc = CHARGED_WAIT;
    CHARGED_ASSERT(l != NULL && change != NULL && after != NULL);
    charged_error_clear(err);
    *after = NULL;
    if (!name_ok(actor)) {
        charged_error_set(err, "the actor must be 1..%d bytes of text on one line",
                          BUDGET_NAME_MAX);
        return CHARGED_BAD_ITEM;
    }
    /* The members' refreshes hold the lock a few ms at a time. */
    for (int tries = 0; tries < SET_TRIES && rc == CHARGED_WAIT; tries++)
        rc = set_once(l, change, actor, after, err);
    return rc;
}
