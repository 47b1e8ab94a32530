/* budget_alloc: the fleet's provider budget divided among its members, pure
 * (no clock, no I/O): the settings and every live member's demand give
 * every member's target share (budget_alloc_targets), and the two-phase
 * rule gives what a member may hold of its target while the others still
 * hold theirs (budget_alloc_take). docs/architecture.md, "The provider
 * budget", says why the fleet's sum never passes the limit.
 *
 * Units: the settings are whole requests per second, as people set them;
 * demands and shares are milli-requests per second (mrps). A demand may be
 * a fraction of a request/s; every target (and so every share held) is a
 * whole number of requests/s (BUDGET_UNIT): a gate spending a whole rate
 * sends no more than that rate in any second, so whole shares that sum
 * within a limit keep every second within it. A limit of 0 is no limit; a
 * share of BUDGET_UNLIMITED is no limit either. */
#ifndef CHARGED_BUDGET_ALLOC_H
#define CHARGED_BUDGET_ALLOC_H

#include <stddef.h>

/* The provider's endpoint classes (the names of the settings, of psp-sim's
 * limiter and of the metrics). */
enum budget_class {
    BUDGET_CLASS_CREATE,   /* POST /v1/payment_intents */
    BUDGET_CLASS_CAPTURE,  /* POST .../capture and .../cancel */
    BUDGET_CLASS_REFUND,   /* POST /v1/refunds */
    BUDGET_CLASS_RETRIEVE, /* GET one intent or refund */
    BUDGET_CLASS_SEARCH,   /* GET /v1/payment_intents/search */
    BUDGET_CLASS_LIST,     /* GET /v1/payment_intents, /v1/refunds */
    BUDGET_CLASS_COUNT
};

/* What a request is for, first served first. */
enum budget_priority {
    BUDGET_PRIO_CAPTURE, /* captures and voids */
    BUDGET_PRIO_REFUND,
    BUDGET_PRIO_CHARGE, /* charges and authorizations */
    BUDGET_PRIO_LOOKUP, /* look-ups that settle UNKNOWN */
    BUDGET_PRIO_AUDIT,  /* the auditor's walks: a floor keeps them alive */
    BUDGET_PRIO_COUNT
};

#define BUDGET_UNLIMITED (-1LL)
/* One request/s in mrps: every target is a whole number of them. */
#define BUDGET_UNIT 1000LL
/* The largest limit one may set (requests/s), and so the largest demand
 * of one (priority, class) a member may report (mrps). */
#define BUDGET_RPS_MAX         1000000LL
#define BUDGET_DEMAND_MAX_MRPS (BUDGET_RPS_MAX * 1000LL)
/* The most members one allocation divides among. */
#define BUDGET_MEMBERS_MAX 4096

/* One account's settings (table provider_budget). */
struct budget_settings {
    long long global_rps;                    /* 0: no limit */
    long long class_rps[BUDGET_CLASS_COUNT]; /* 0: no limit for the class */
    long long audit_floor_rps; /* what the audit priority gets first when it
                                  has demand: of the global limit when one
                                  is set, else of each class limit */
};

/* What a member would send, by what for and where (mrps, >= 0). */
struct budget_demand {
    long long mrps[BUDGET_PRIO_COUNT][BUDGET_CLASS_COUNT];
};

/* A member's share (mrps, or BUDGET_UNLIMITED): of the global limit and of
 * each class's. floor_mrps is the part of global_mrps its audit requests
 * may take ahead of every other priority (<= global_mrps). */
struct budget_share {
    long long global_mrps;
    long long class_mrps[BUDGET_CLASS_COUNT];
    long long floor_mrps;
};

/* "create", ...; NULL out of range. parse: the value, or -1. */
const char *budget_class_name(enum budget_class c);
int budget_class_parse(const char *name);
const char *budget_priority_name(enum budget_priority p);
int budget_priority_parse(const char *name);

/* 0 when the settings may be set, else -1 and why (a static string): a
 * value outside 0..BUDGET_RPS_MAX, or a floor above a set global limit. */
int budget_settings_check(const struct budget_settings *s, const char **why);
/* 1 when after raises a limit of before that binds the classes in the
 * mask (bit 1 << class): the global's, or one of those classes' (a larger
 * number, or none where there was one); else 0: a set that changed
 * nothing, only lowered, or raised only other classes. */
int budget_settings_raised(const struct budget_settings *before,
                           const struct budget_settings *after, unsigned classes);
/* 0 when each demand is in 0..BUDGET_DEMAND_MAX_MRPS, else -1 and why. */
int budget_demand_check(const struct budget_demand *d, const char **why);

/* Every member's target from the settings and the n members' demands, in
 * that order: the audit floor first (to members with audit demand; of the
 * global limit, or without one of each class limit), then
 * each priority in order, each class within its class limit and all within
 * the global one (a priority's grant split among its members max-min fair:
 * one asking less than an even share gets all it asks; then rounded to
 * whole requests/s, the units left to the largest fractions), then what is left split
 * evenly among the members with demand (any member when none has): room to grow. The
 * targets' sum stays within each limit. 0, or -1 and why when an input is refused (a
 * bad setting or demand, n above BUDGET_MEMBERS_MAX); targets is then zeroed. n may be
 * 0. */
int budget_alloc_targets(const struct budget_settings *s,
                         const struct budget_demand *demands, size_t n,
                         struct budget_share *targets, const char **why);

/* One live member as a refresh sees it: its id (the member_id of
 * provider_budget_members, a UUID's text; every member reads the same) and
 * its demand. */
#define BUDGET_MEMBER_ID_SIZE 48
struct budget_member_view {
    char id[BUDGET_MEMBER_ID_SIZE];
    struct budget_demand demand;
};

/* The target of members[own] among the fleet's n live members (ids
 * distinct), in any order: budget_alloc_targets over the members ordered by
 * id (strcmp), the order every member sees alike, rotated: the member at
 * place rotation % n of that order first. The rounding gives its odd units
 * to the first members of the order; without the rotation, with more members
 * asking than the limit has whole requests/s, the same ids would get them at
 * every refresh and the last ones nothing for as long as the first have a
 * backlog. A member that put itself in a place of its own (e.g. last) would
 * compute that they are another's, as every other member would: nobody would
 * take them. With one order and one rotation (budget_alloc_rotation of the
 * database's clock) every member computes the same allocation and takes its
 * own row of it; members that disagree for a refresh (one read the clock
 * just before a rotation, another just after) stay within the limits by the
 * two-phase take. 0, or -1 and why (as budget_alloc_targets; *target then
 * zeroed). */
int budget_alloc_member_target(const struct budget_settings *s,
                               const struct budget_member_view *members, size_t n,
                               size_t own, unsigned long long rotation,
                               struct budget_share *target, const char **why);

/* How long one rotation of the order lasts (ms of the database's clock):
 * whole leases (budget_lease.h's BUDGET_LEASE_MS, 1 s), five of them. A
 * unit that changes hands is idle until its old holder's next refresh
 * gives it back, and its new holder's gate starts empty: about a request
 * lost per handover: at a limit of 2 among three members with backlogs,
 * 18 requests of 30 in 15 s with a rotation every lease, 28 every five
 * (test_adv38f_odd_unit_starves); and five seconds is still short against a
 * backlog's wait (a member holds 0 for at most n - units rotations). */
#define BUDGET_ROTATE_MS 5000LL
/* The rotation at db_ms (ms since the epoch on the database's clock, as
 * every member reads it in its refresh): whole periods of BUDGET_ROTATE_MS;
 * 0 for a clock before the epoch. */
unsigned long long budget_alloc_rotation(long long db_ms);

/* What a refresh trusts of another member's row (its share and demand as
 * read from the table, where anyone with write access could have put
 * anything): a held value under a limit counts as 0..the limit (-1, "no
 * limit" held from before the limit was set, and anything above it as the
 * whole limit, other negatives as 0); under no limit as BUDGET_UNLIMITED
 * (it bounds nothing); the floor as 0..the global limit. A demand counts as
 * 0..BUDGET_DEMAND_MAX_MRPS. So a forged row can take at most the whole
 * limit, as a real member's stale "no limit" does, and cannot refuse the
 * allocation. */
void budget_share_bound(const struct budget_settings *s, struct budget_share *held);
void budget_demand_bound(struct budget_demand *d);

/* others = others + one, a limit at a time (BUDGET_UNLIMITED absorbs). */
void budget_share_add(struct budget_share *others, const struct budget_share *one);
/* The zero share (others of an empty fleet, a member without a lease). */
void budget_share_zero(struct budget_share *s);

/* The two-phase rule: what a member holds from now, given its target and
 * the sum of what the other live members hold: for each limit,
 * min(target, limit - others), never below 0 (a member lowers to its
 * target at once and takes more only from room already given back); no
 * limit: its target. So the holders' sum stays within each limit whenever
 * every member's hold is taken this way, one at a time. */
void budget_alloc_take(const struct budget_settings *s,
                       const struct budget_share *target,
                       const struct budget_share *others, struct budget_share *held);

/* What a holder may spend of its share, in place: all of it, but under a
 * limit of exactly 1 req/s at most BUDGET_ONE_RPS_MRPS. The provider's
 * bucket holds as many tokens as its rate: at 2 and more the second token
 * takes a request the wire brought a few ms early, at 1 none can, and one
 * request in five came back 429. 1.25 s apart leaves 250 ms for the wire.
 * The floor never exceeds what may be spent. */
#define BUDGET_ONE_RPS_MRPS 800LL
void budget_share_spendable(const struct budget_settings *s, struct budget_share *held);

/* Whether the held shares' sum is within every limit (for tests and the
 * simulation): 1 or 0. */
int budget_alloc_within(const struct budget_settings *s,
                        const struct budget_share *sum);

#endif
