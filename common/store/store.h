/* store: what every store (attempt_store, outbox_store, webhook_store)
 * answers, so that a role decides what to do next from one vocabulary.
 *
 * Every fallible store call returns an enum store_rc and fills a struct
 * store_error the caller passes: the line to log and the SQLSTATE of the
 * statement that failed. Nothing travels beside them (no thread-local). A
 * call that fails has changed nothing the caller must undo. New codes are
 * added last; none is ever removed or renumbered. */
#ifndef CHARGED_STORE_H
#define CHARGED_STORE_H

enum store_rc {
    STORE_OK = 0,
    STORE_RETRY,      /* the database is unavailable (connection, deadlock,
                         shutdown, timeout, no answer by the deadline) or it
                         was a bug of ours: repeat the whole call later,
                         after a back-off */
    STORE_DATA,       /* the database refused a value of the call: repeating
                         it fails again; repeat item by item to find it */
    STORE_LOCKED,     /* another session's uncommitted change held the
                         statement past its lock_timeout: nothing written;
                         the item waits and is tried again later */
    STORE_NOT_FOUND,  /* no such row (a status view's attempt or order) */
    STORE_NOT_LEADER, /* another process holds the lead (the relay's lock) */
};

/* Why a call failed. Every call empties it first; a failure fills it. */
struct store_error {
    char message[512]; /* one line, secrets redacted, for the log */
    char sqlstate[6];  /* the failed statement's SQLSTATE; "" when the server
                          gave none (unreachable, or no statement failed) */
};

/* How long one statement of a store may take. The server ends a statement
 * of ours after store_timeout_ms() (its statement_timeout, set on every
 * session); the client gives it up STORE_DEADLINE_GRACE_MS later if the
 * server has not answered even that (a frozen host, a partition that keeps
 * TCP open): the call returns STORE_RETRY with "database did not answer
 * within N ms", its session is closed (the call's later statements fail at
 * once) and the next call opens a new one. So a database that hangs costs
 * a caller one deadline per call, never its loop. A statement given up may
 * still run once the server comes back: like one whose connection broke,
 * it is one the caller repeats, and every store call is safe to repeat.
 *
 * Process-wide: set it before the first store call (daemon_main does, from
 * DATABASE_TIMEOUT_MS); a session already open keeps the statement_timeout
 * it was opened with. */
#define STORE_TIMEOUT_DEFAULT_MS 10000
#define STORE_DEADLINE_GRACE_MS  1000
void store_set_timeout_ms(long long ms);
long long store_timeout_ms(void);

/* Empties both fields. */
void store_error_clear(struct store_error *err);
/* A failure that is not a statement's: the message, and no SQLSTATE. */
void store_error_set(struct store_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
