/* sim_rng: the simulation's one source of chance. xoshiro256** seeded by
 * splitmix64 from one 64-bit seed, so that a seed names one run exactly. */
#ifndef CHARGED_SIM_RNG_H
#define CHARGED_SIM_RNG_H

#include <stdint.h>

struct sim_rng {
    uint64_t s[4];
};

static inline uint64_t sim_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void sim_rng_seed(struct sim_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = sim_splitmix64(&seed);
}

static inline uint64_t sim_rng_next(struct sim_rng *r)
{
    uint64_t *s = r->s;
    uint64_t x = s[1] * 5;
    uint64_t result = ((x << 7) | (x >> 57)) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return result;
}

/* Uniform in [0, n); n > 0. The bias of a 64-bit modulo is negligible here. */
static inline uint64_t sim_rng_below(struct sim_rng *r, uint64_t n)
{
    return sim_rng_next(r) % n;
}

/* True with probability per_mille / 1000. */
static inline int sim_rng_chance(struct sim_rng *r, unsigned per_mille)
{
    return sim_rng_below(r, 1000) < per_mille;
}

/* FNV-1a over 64-bit words: the final state hash. */
static inline uint64_t sim_hash_mix(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

#endif
