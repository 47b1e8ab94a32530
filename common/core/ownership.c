#include "ownership.h"

#include <stdio.h>
#include <string.h>

#include "charged_assert.h"

static int present(const char *s)
{
    return s && s[0];
}

static enum ownership_verdict say(enum ownership_verdict v, char *why, size_t size,
                                  const char *text)
{
    /* Only a verdict against the claim says why. */
    CHARGED_ASSERT(v == OWNERSHIP_FOREIGN || v == OWNERSHIP_UNPROVEN);
    if (why && size)
        snprintf(why, size, "%s", text);
    return v;
}

enum ownership_verdict ownership_judge(const struct ownership_claim *c, char *why,
                                       size_t why_size)
{
    CHARGED_ASSERT(c);
    CHARGED_ASSERT(why || why_size == 0);
    if (why && why_size)
        why[0] = '\0';
    if (c->recorded_elsewhere)
        return say(OWNERSHIP_FOREIGN, why, why_size,
                   "the object is recorded for another of ours");
    if (present(c->parent_id) && present(c->object_parent_id) &&
        strcmp(c->parent_id, c->object_parent_id) != 0)
        return say(OWNERSHIP_FOREIGN, why, why_size,
                   "the refund is on another charge's intent");
    /* Our recorded id, or our own answer, wins over metadata: anyone may
     * edit the metadata of our own object afterwards. */
    if (present(c->recorded_id)) {
        if (present(c->object_id) && strcmp(c->recorded_id, c->object_id) == 0)
            return OWNERSHIP_OURS;
        return say(OWNERSHIP_FOREIGN, why, why_size,
                   "we recorded another object from our own call");
    }
    if (c->own_answer)
        return OWNERSHIP_OURS;
    if (c->names_another)
        return say(OWNERSHIP_FOREIGN, why, why_size,
                   "its metadata names another of ours");
    return say(OWNERSHIP_UNPROVEN, why, why_size,
               "it only names us: neither our recorded id nor the answer under our "
               "key");
}

const char *ownership_verdict_name(enum ownership_verdict v)
{
    switch (v) {
    case OWNERSHIP_OURS:
        return "ours";
    case OWNERSHIP_UNPROVEN:
        return "unproven";
    case OWNERSHIP_FOREIGN:
        return "foreign";
    }
    return "unproven";
}
