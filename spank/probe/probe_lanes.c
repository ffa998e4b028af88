/*
 * Lanes: which copy of a slot's proxy-side group (network totals, wait gauges, rate
 * window, peer table) each thread writes, so that no cache line of it is written by two
 * threads (sattr_probe_layout.h). The event path asks sattr_my_lane(); only a thread's
 * first event in a slot comes here.
 *
 * Claim order: the slot's own copy if no thread writes it; else a pool lane already bound
 * to this slot whose thread has exited; else a never used pool lane; else (pool spent)
 * the slot's own copy, shared, as version 1 did (counts may then be lost, never memory;
 * flagged in the header). A pool lane stays bound to its slot: what it counted is part of
 * that slot's totals, and a later thread of the same slot simply adds to it.
 *
 * Thread exit hands the thread's lanes back through a pthread key destructor. The key
 * is deleted when the library is unloaded (NCCL dlcloses us after the last communicator),
 * so no thread can call into unmapped code; lanes of threads still alive then stay
 * taken until the next load, which frees them all (sattr_lanes_reopened).
 */
#include <pthread.h>
#include <string.h>

#include "probe_internal.h"

SATTR_HIDDEN __thread struct sattr_tls sattr_tls;
SATTR_HIDDEN struct sattr_steps sattr_lane_steps[SATTR_PROBE_NLANES];

static uint32_t next_token;      /* writer tokens; 0 is "nobody" */
static pthread_key_t exit_key;
static int exit_key_made;

#define BIND(tok, idx) ((uint64_t)(tok) << 32 | ((uint64_t)(idx) + 1u))

static void lanes_release(void *unused)
{
    struct sattr_tls *t = &sattr_tls;
    (void)unused;
    if (t->epoch != SA_LD(&sattr_proc.epoch) || sattr_proc.hdr == NULL)
        return; /* another record's lanes (before a fork or a reload): not ours to free */
    for (unsigned idx = 0; idx < SATTR_PROBE_NSLOTS; idx++) {
        unsigned v = t->lane[idx], lane = (v & 0x1fu) - 1u;
        if (!(v & SATTR_LANE_OWNED))
            continue;
        if (lane == 0) {
            uint32_t tok = t->token;
            __atomic_compare_exchange_n(&sattr_proc.slots[idx].lane_owner, &tok, 0u, 0,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED);
        } else {
            uint64_t b = BIND(t->token, idx);
            __atomic_compare_exchange_n(&sattr_proc.lanes[lane - 1].bind, &b, BIND(0, idx), 0,
                                        __ATOMIC_RELEASE, __ATOMIC_RELAXED);
        }
        t->lane[idx] = 0;
    }
}

static void lanes_unload(void) __attribute__((destructor));
static void lanes_unload(void)
{
    if (exit_key_made)
        pthread_key_delete(exit_key);
}

SATTR_HIDDEN void sattr_lanes_setup(void)
{
    if (!exit_key_made)
        exit_key_made = pthread_key_create(&exit_key, lanes_release) == 0;
}

SATTR_HIDDEN void sattr_lanes_reopened(void)
{
    /* every communicator of the previous load was finalized before NCCL unloaded us, and
     * that code is gone: nobody writes any lane now */
    uint32_t used = SA_LD(&sattr_proc.hdr->nslots_used);
    for (uint32_t i = 0; i < used && i < SATTR_PROBE_NSLOTS; i++)
        SA_ST(&sattr_proc.slots[i].lane_owner, 0u);
    for (unsigned k = 0; k < SATTR_PROBE_NLANES; k++)
        SA_ST(&sattr_proc.lanes[k].bind, SA_LD(&sattr_proc.lanes[k].bind) & 0xffffffffu);
}

static unsigned take(struct sattr_tls *t, unsigned idx)
{
    struct sattr_slot *s = &sattr_proc.slots[idx];
    struct sattr_hdr *h = sattr_proc.hdr;
    uint32_t zero = 0;
    if (__atomic_compare_exchange_n(&s->lane_owner, &zero, t->token, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED))
        return 0;
    for (unsigned k = 0; k < SATTR_PROBE_NLANES; k++) { /* a lane of this slot, handed back */
        uint64_t b = BIND(0, idx);
        if (__atomic_compare_exchange_n(&sattr_proc.lanes[k].bind, &b, BIND(t->token, idx), 0,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            SA_ADD(&sattr_proc.lanes[k].claims, 1);
            return k + 1;
        }
    }
    for (unsigned k = 0; k < SATTR_PROBE_NLANES; k++) { /* a fresh one */
        uint64_t b = 0;
        struct sattr_lane *l = &sattr_proc.lanes[k];
        if (SA_LD(&l->bind) != 0 ||
            !__atomic_compare_exchange_n(&l->bind, &b, BIND(t->token, idx), 0, __ATOMIC_ACQUIRE,
                                         __ATOMIC_RELAXED))
            continue;
        SA_ST(&l->net.win_ms, SA_LD(&s->win_ms));
        SA_ST(&l->net.win_start_ns, sattr_now());
        SA_ADD(&l->claims, 1);
        uint32_t used = SA_LD(&h->lanes_used);
        while (used < k + 1 && !__atomic_compare_exchange_n(&h->lanes_used, &used, k + 1, 0,
                                                            __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            ;
        memset(&sattr_lane_steps[k], 0, sizeof(sattr_lane_steps[k]));
        return k + 1;
    }
    SA_ADD(&h->lanes_full, 1);
    __atomic_fetch_or(&h->flags, SATTR_HF_LANES_FULL, __ATOMIC_RELAXED);
    return SATTR_PROBE_NLANES + 1; /* marker: the own copy, shared */
}

SATTR_HIDDEN unsigned sattr_lane_claim(unsigned idx)
{
    struct sattr_tls *t = &sattr_tls;
    uint64_t epoch = SA_LD(&sattr_proc.epoch);
    unsigned lane;
    if (t->epoch != epoch) {
        memset(t->lane, 0, sizeof(t->lane));
        t->epoch = epoch;
    }
    if (t->token == 0) {
        do
            t->token = SA_ADD(&next_token, 1) + 1;
        while (t->token == 0);
    }
    if (sattr_proc.hdr == NULL || idx >= SATTR_PROBE_NSLOTS)
        return 0;
    lane = take(t, idx);
    if (lane == SATTR_PROBE_NLANES + 1) {
        t->lane[idx] = 1; /* not owned: nothing to hand back */
        return 0;
    }
    t->lane[idx] = (uint8_t)((lane + 1) | SATTR_LANE_OWNED);
    if (exit_key_made)
        pthread_setspecific(exit_key, (void *)1); /* so that lanes_release runs at exit */
    return lane;
}
