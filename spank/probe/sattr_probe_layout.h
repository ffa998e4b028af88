/*
 * The per-rank probe record: one fixed-size file per process, mmap'd MAP_SHARED so it
 * outlives a SIGKILL. Written by the plugin, read post mortem by slurm_attr/probe/layout.py
 * (which mirrors every offset below; `probe_harness --layout` prints them for the test
 * that keeps the two in step).
 *
 * Rules of the format (layout version 2; version 1 had no lanes and is still read):
 * - little-endian, fixed offsets, every field naturally aligned so 8-byte loads are atomic;
 * - counters only grow; writers use relaxed atomics, readers need no lock;
 * - each group of fields has one writer thread class (app, launch, proxy, kernel) and
 *   groups written by different threads start on separate cache lines;
 * - entries of the rings carry a tag written last (release): a reader keeps an entry
 *   only when its tag matches the position it expects, so a torn entry (process killed
 *   mid-write) is skipped, never misread;
 * - the magic is written last at creation: a file without it was never initialised;
 * - lanes (version 2): the proxy-side group of a slot (network totals, wait gauges, rate
 *   window, peer table) is written by one thread per lane. The first thread that needs
 *   it in a slot writes the slot's own copy; any further thread takes a lane of the
 *   pool after the slots (bound to that slot until the process ends, handed to another
 *   thread of the same slot when its thread exits). So no cache line of that group is
 *   written by two threads, however many threads NCCL (or a test) drives one
 *   communicator from. A step's gauges and counters stay in the lane of the thread that
 *   started it. The reader adds a slot's lanes to its own copy: counters, gauges and
 *   windows sum, stamps take the latest, peers merge by rank.
 * The file is job-written and therefore hostile to the reader: nothing here is trusted
 * by the analysis without bounds checks.
 */
#ifndef SATTR_PROBE_LAYOUT_H
#define SATTR_PROBE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define SATTR_PROBE_MAGIC_STR "SATTRPRB"
#define SATTR_PROBE_MAGIC 0x4252505254544153ULL /* "SATTRPRB" read as a little-endian u64 */
#define SATTR_PROBE_LAYOUT_VER 2u
#define SATTR_PROBE_HDR_SIZE 4096u
#define SATTR_PROBE_SLOT_SIZE 2304u
#define SATTR_PROBE_NSLOTS 40u
#define SATTR_PROBE_NLANES 16u  /* extra writer threads, all slots together */
#define SATTR_PROBE_LANE_SIZE 896u
#define SATTR_PROBE_LANES_OFF (SATTR_PROBE_HDR_SIZE + SATTR_PROBE_NSLOTS * SATTR_PROBE_SLOT_SIZE)
#define SATTR_PROBE_FILE_SIZE (SATTR_PROBE_LANES_OFF + SATTR_PROBE_NLANES * SATTR_PROBE_LANE_SIZE)
/* version 1 (no lane pool), still read by slurm_attr/probe/record.py */
#define SATTR_PROBE_V1_FILE_SIZE SATTR_PROBE_LANES_OFF
#define SATTR_PROBE_HRING 60u   /* recent operations, all communicators */
#define SATTR_PROBE_OPRING 16u  /* recent collectives per communicator (power of two) */
#define SATTR_PROBE_NCHAN 64u   /* MAXCHANNELS since NCCL 2.25 */
#define SATTR_PROBE_NPEERS 12u
#define SATTR_PROBE_NFUNC 12u
#define SATTR_PROBE_NWAIT 6u

/* header flags */
#define SATTR_HF_SLOTS_FULL (1u << 0) /* a communicator found no free slot */
#define SATTR_HF_STEPS_FULL (1u << 1) /* a proxy step found no free step record */
#define SATTR_HF_PEERS_FULL (1u << 2) /* a peer found no free peer entry */
#define SATTR_HF_REOPENED (1u << 3)   /* the plugin was unloaded and loaded again */
#define SATTR_HF_LANES_FULL (1u << 4) /* a thread found no free lane: it shares the slot's own */

/* slot states */
#define SATTR_SLOT_FREE 0u
#define SATTR_SLOT_ACTIVE 1u
#define SATTR_SLOT_FINALIZED 2u

/* Function codes (api_func[], func_seq[], ring func): NCCL's ncclFuncToString names. */
enum {
    SATTR_F_BROADCAST, SATTR_F_REDUCE, SATTR_F_ALLGATHER, SATTR_F_REDUCESCATTER,
    SATTR_F_ALLREDUCE, SATTR_F_SENDRECV, SATTR_F_SEND, SATTR_F_RECV, SATTR_F_ALLTOALL,
    SATTR_F_GATHER, SATTR_F_SCATTER, SATTR_F_OTHER
};
/* Datatype codes (0 = unknown): ncclDatatypeToString names. */
enum {
    SATTR_DT_UNKNOWN, SATTR_DT_INT8, SATTR_DT_UINT8, SATTR_DT_INT32, SATTR_DT_UINT32,
    SATTR_DT_INT64, SATTR_DT_UINT64, SATTR_DT_FLOAT16, SATTR_DT_FLOAT32, SATTR_DT_FLOAT64,
    SATTR_DT_BFLOAT16, SATTR_DT_FLOAT8E4M3, SATTR_DT_FLOAT8E5M2
};
/* Algorithm and protocol codes (0 = unknown). */
enum { SATTR_AL_UNKNOWN, SATTR_AL_TREE, SATTR_AL_RING, SATTR_AL_COLLNET_DIRECT,
       SATTR_AL_COLLNET_CHAIN, SATTR_AL_NVLS, SATTR_AL_NVLS_TREE, SATTR_AL_PAT,
       SATTR_AL_CE /* our code for a copy-engine collective (v6 CeColl): NCCL names no algorithm */ };
enum { SATTR_PR_UNKNOWN, SATTR_PR_LL, SATTR_PR_LL128, SATTR_PR_SIMPLE };
/* Wait-state gauges: where a proxy step currently sits (research/nccl-probe.md 3). */
enum {
    SATTR_W_SEND_GPU,  /* SendGPUWait: the local GPU has not produced the data */
    SATTR_W_SEND_PEER, /* SendPeerWait: the receiver has not posted a buffer */
    SATTR_W_SEND_NET,  /* SendWait: posted to the network, not completed: NIC/link/remote NIC */
    SATTR_W_RECV_NET,  /* RecvWait: nothing arriving */
    SATTR_W_RECV_FLUSH, /* RecvFlushWait: GDR flush / PCIe */
    SATTR_W_RECV_GPU   /* RecvGPUWait: the local GPU has not consumed the data */
};

/* Header ring entry: one recent operation of any communicator (64 B). */
struct sattr_hring_ent {
    uint32_t tag;          /* ring position + 1 (low 32 bits), written last */
    uint8_t slot;          /* communicator slot index */
    uint8_t func;
    uint8_t dtype;
    uint8_t kind;          /* 1 collective, 2 point-to-point */
    int32_t root_or_peer;
    uint8_t nch;
    uint8_t algo;
    uint8_t proto;
    uint8_t flags;
    uint64_t comm_hash;
    uint64_t seq;          /* NCCL seqNumber (collectives) or p2p task index */
    uint64_t count;
    uint64_t start_ns;     /* CLOCK_MONOTONIC(_COARSE) */
    uint64_t opi;          /* per-communicator collective index */
    uint64_t rsvd;
};

struct sattr_hdr {
    uint64_t magic;
    uint32_t layout_ver;
    uint32_t hdr_size;
    uint32_t slot_size;
    uint32_t nslots;
    uint64_t file_size;
    uint32_t pid;
    int32_t global_rank;   /* RANK, else SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMIX_RANK; -1 */
    int32_t local_rank;
    int32_t world_size;
    uint64_t job_id;       /* SLURM_JOB_ID */
    uint32_t step_id;      /* SLURM_STEP_ID */
    uint32_t nccl_version; /* ncclGetVersion() if the symbol is visible, else 0 */
    uint64_t create_rt_ns; /* CLOCK_REALTIME at creation ... */
    uint64_t create_mono_ns; /* ... and CLOCK_MONOTONIC at the same moment: converts stamps */
    uint64_t heartbeat_ns; /* last event that read the clock */
    uint32_t event_mask;
    uint32_t api_ver;      /* highest profiler API version NCCL initialised us with */
    char hostname[64];
    uint32_t nslots_used;
    uint32_t flags;
    uint32_t ring_head;    /* next header ring position (monotonic) */
    uint32_t pxn_foreign;  /* proxy events of other processes' ranks (PXN), ignored */
    uint64_t dropped_total; /* events not recorded: no slot, no step record, bad handle */
    char node_name[32];    /* SLURMD_NODENAME */
    int32_t slurm_procid;
    uint32_t win_ms;       /* rate window length */
    uint32_t clock_id;     /* clock of every *_ns stamp (6 = CLOCK_MONOTONIC_COARSE) */
    uint32_t inits;        /* init calls, all communicators, all loads of the plugin */
    uint64_t proc_nonce;   /* AT_RANDOM of the process: tells a reload from a reused pid */
    uint32_t lanes_used;   /* pool lanes ever bound to a slot (high-water mark) */
    uint32_t lanes_full;   /* lane claims that found none free */
    uint8_t rsvd[8];
    struct sattr_hring_ent ring[SATTR_PROBE_HRING];
};

/* Per-communicator recent collective (32 B), indexed by opi % SATTR_PROBE_OPRING. */
struct sattr_op_ent {
    uint32_t tag;          /* opi + 1 (low 32 bits), written last */
    uint8_t func;
    uint8_t dtype;
    uint8_t algo;
    uint8_t proto;
    int32_t root;
    uint8_t nch;
    uint8_t nwarps;
    uint16_t flags;
    uint64_t count;
    uint64_t seq;
};

/* Kernel progress of one channel: (func << 28) | ((seq + 1) & 0x0fffffff); 0 = never. */
struct sattr_chan {
    uint32_t kstart;
    uint32_t kstop;
};

/* One peer of this rank in the communicator (48 B): NET proxy traffic and p2p tasks. */
struct sattr_peer {
    uint32_t key;          /* peer's comm rank + 1; 0 = free entry */
    uint8_t last_ch;       /* channel of the last step that changed state */
    uint8_t kind;          /* bit0 net send, bit1 net recv, bit2 p2p send, bit3 p2p recv */
    uint16_t rsvd;
    uint32_t send_posted;  /* proxy steps */
    uint32_t send_done;
    uint32_t recv_posted;
    uint32_t recv_done;
    uint16_t wait[SATTR_PROBE_NWAIT]; /* steps toward/from this peer now in each wait state */
    uint32_t last_send_ms; /* ms since create_mono_ns + 1 of the last completed send step; 0 never */
    uint32_t last_recv_ms;
    uint32_t p2p_ops;      /* p2p tasks (ncclSend/ncclRecv) with this peer */
};

/* The proxy-side counters of one writer thread in one slot (256 B, 4 cache lines): the
 * slot's own copy (at slot offset 448) and each pool lane's copy have this layout. */
#define SATTR_LANE_CORE_FIELDS                                                            \
    /* network steps (proxy thread): CCL-D's SendCount / RecvCount */                     \
    uint64_t send_posted;                                                                 \
    uint64_t send_done;                                                                   \
    uint64_t recv_posted;                                                                 \
    uint64_t recv_done;                                                                   \
    uint64_t send_bytes;                                                                  \
    uint64_t recv_bytes;                                                                  \
    uint64_t pop_started;                                                                 \
    uint64_t pop_stopped;                                                                 \
    uint32_t in_state[SATTR_PROBE_NWAIT]; /* steps now in each wait state */               \
    uint32_t steps_dropped;                                                               \
    uint32_t peers_dropped;                                                               \
    uint64_t last_progress_ns; /* last step completion, either direction */               \
    uint64_t last_send_done_ns;                                                           \
    uint64_t last_recv_done_ns;                                                           \
    uint64_t rsvd3;                                                                       \
    /* rate window, rolled on step completion */                                         \
    uint64_t win_start_ns;                                                                \
    uint32_t win_ms;                                                                      \
    uint32_t win_closed;                                                                  \
    uint64_t win_send_steps; /* deltas of the last closed window */                       \
    uint64_t win_recv_steps;                                                              \
    uint64_t win_send_bytes;                                                              \
    uint64_t win_recv_bytes;                                                              \
    uint64_t base_send_steps; /* totals when the open window started */                   \
    uint64_t base_recv_steps;                                                             \
    uint64_t base_send_bytes;                                                             \
    uint64_t base_recv_bytes;                                                             \
    uint64_t rsvd4[6];

struct sattr_lane_core {
    SATTR_LANE_CORE_FIELDS
};

struct sattr_slot {
    /* identity: init / finalize, under the plugin's init lock */
    uint64_t comm_hash;
    uint32_t state;
    uint32_t api_ver;
    int32_t rank;
    int32_t nranks;
    int32_t nnodes;
    uint32_t lane_owner;   /* token of the thread writing the slot's own lane; 0 = none */
    uint64_t init_ns;
    uint64_t fini_ns;
    char comm_name[16];
    /* API calls (application thread, v5+) */
    uint64_t coll_api_enter;
    uint64_t coll_api_exit;
    uint64_t p2p_api_enter;
    uint64_t p2p_api_exit;
    uint64_t group_api_enter;
    uint64_t group_api_exit;
    uint64_t last_api_ns;
    uint32_t graph_captured; /* API calls seen while a CUDA graph was being captured */
    uint32_t api_last_func;
    uint32_t api_func[SATTR_PROBE_NFUNC]; /* CollApi/P2pApi calls per function */
    uint64_t api_last_count;
    uint64_t rsvd1;
    /* launched tasks (launching or host-callback thread) */
    uint64_t func_seq[SATTR_PROBE_NFUNC]; /* highest Coll seqNumber + 1 per function */
    uint64_t coll_tasks;
    uint64_t p2p_tasks;
    uint64_t last_task_ns;
    uint64_t op_count;     /* collectives launched on this communicator (next opi) */
    uint64_t last_seq;
    uint8_t last_func;
    uint8_t last_dtype;
    uint8_t last_algo;
    uint8_t last_proto;
    uint8_t last_nch;
    uint8_t last_nwarps;
    uint16_t last_flags;
    uint64_t last_count;
    int32_t last_root;
    int32_t last_peer;     /* peer of the last p2p task */
    uint64_t last_start_ns;
    uint64_t op_digest;    /* running hash of (func, count, dtype, root) of every collective */
    uint64_t ce_tasks;     /* of coll_tasks, those the copy engines run (v6+): no kernel channels */
    uint64_t rsvd2;
    /* kernel channels (proxy thread, or NCCL's profiler thread since 2.31) */
    uint64_t kch_started;
    uint64_t kch_stopped;
    uint64_t kch_inflight; /* bit per channel with a started, not stopped KernelCh */
    uint64_t kch_cur;      /* last started: (func << 56) | (seq + 1) */
    uint64_t kch_done;     /* last stopped, same packing */
    uint64_t kch_start_ptimer;
    uint64_t kch_stop_ptimer;
    uint64_t kch_last_ns;
    /* the slot's own lane: one view by field name (readers), one as a lane (the writer) */
    union {
        struct sattr_lane_core net;
        struct {
            SATTR_LANE_CORE_FIELDS
        };
    };
    struct sattr_op_ent ops[SATTR_PROBE_OPRING]; /* application thread */
    struct sattr_chan chan[SATTR_PROBE_NCHAN];   /* kernel writer */
    struct sattr_peer peers[SATTR_PROBE_NPEERS]; /* the own lane's: proxy (net), app (p2p) */
};

/* A pool lane (896 B): one more writer thread's copy of a slot's proxy-side group. */
struct sattr_lane {
    uint64_t bind;         /* (writer token << 32) | (slot index + 1); token 0 = free to take */
    uint32_t claims;       /* threads that took this lane */
    uint32_t rsvd0;
    uint64_t rsvd[6];
    struct sattr_lane_core net;
    struct sattr_peer peers[SATTR_PROBE_NPEERS];
};

#define SATTR_LPIN(T, m, off) _Static_assert(offsetof(T, m) == (off), #T "." #m " moved")
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the record is little-endian");
_Static_assert(sizeof(struct sattr_hring_ent) == 64, "header ring entry");
SATTR_LPIN(struct sattr_hring_ent, slot, 4);
SATTR_LPIN(struct sattr_hring_ent, root_or_peer, 8);
SATTR_LPIN(struct sattr_hring_ent, nch, 12);
SATTR_LPIN(struct sattr_hring_ent, comm_hash, 16);
SATTR_LPIN(struct sattr_hring_ent, seq, 24);
SATTR_LPIN(struct sattr_hring_ent, count, 32);
SATTR_LPIN(struct sattr_hring_ent, start_ns, 40);
SATTR_LPIN(struct sattr_hring_ent, opi, 48);
_Static_assert(sizeof(struct sattr_hdr) == SATTR_PROBE_HDR_SIZE, "header size");
SATTR_LPIN(struct sattr_hdr, layout_ver, 8);
SATTR_LPIN(struct sattr_hdr, file_size, 24);
SATTR_LPIN(struct sattr_hdr, pid, 32);
SATTR_LPIN(struct sattr_hdr, global_rank, 36);
SATTR_LPIN(struct sattr_hdr, job_id, 48);
SATTR_LPIN(struct sattr_hdr, step_id, 56);
SATTR_LPIN(struct sattr_hdr, create_rt_ns, 64);
SATTR_LPIN(struct sattr_hdr, create_mono_ns, 72);
SATTR_LPIN(struct sattr_hdr, heartbeat_ns, 80);
SATTR_LPIN(struct sattr_hdr, event_mask, 88);
SATTR_LPIN(struct sattr_hdr, hostname, 96);
SATTR_LPIN(struct sattr_hdr, nslots_used, 160);
SATTR_LPIN(struct sattr_hdr, ring_head, 168);
SATTR_LPIN(struct sattr_hdr, dropped_total, 176);
SATTR_LPIN(struct sattr_hdr, node_name, 184);
SATTR_LPIN(struct sattr_hdr, slurm_procid, 216);
SATTR_LPIN(struct sattr_hdr, inits, 228);
SATTR_LPIN(struct sattr_hdr, proc_nonce, 232);
SATTR_LPIN(struct sattr_hdr, lanes_used, 240);
SATTR_LPIN(struct sattr_hdr, lanes_full, 244);
SATTR_LPIN(struct sattr_hdr, ring, 256);
_Static_assert(sizeof(struct sattr_op_ent) == 32, "op ring entry");
SATTR_LPIN(struct sattr_op_ent, root, 8);
SATTR_LPIN(struct sattr_op_ent, nch, 12);
SATTR_LPIN(struct sattr_op_ent, count, 16);
SATTR_LPIN(struct sattr_op_ent, seq, 24);
_Static_assert(sizeof(struct sattr_chan) == 8, "channel entry");
_Static_assert(sizeof(struct sattr_peer) == 48, "peer entry");
SATTR_LPIN(struct sattr_peer, send_posted, 8);
SATTR_LPIN(struct sattr_peer, wait, 24);
SATTR_LPIN(struct sattr_peer, last_send_ms, 36);
SATTR_LPIN(struct sattr_peer, p2p_ops, 44);
_Static_assert(sizeof(struct sattr_slot) == SATTR_PROBE_SLOT_SIZE, "slot size");
SATTR_LPIN(struct sattr_slot, state, 8);
SATTR_LPIN(struct sattr_slot, rank, 16);
SATTR_LPIN(struct sattr_slot, lane_owner, 28);
SATTR_LPIN(struct sattr_slot, init_ns, 32);
SATTR_LPIN(struct sattr_slot, comm_name, 48);
SATTR_LPIN(struct sattr_slot, coll_api_enter, 64);  /* app thread: own cache line */
SATTR_LPIN(struct sattr_slot, api_func, 128);
SATTR_LPIN(struct sattr_slot, func_seq, 192);       /* launch thread */
SATTR_LPIN(struct sattr_slot, coll_tasks, 288);
SATTR_LPIN(struct sattr_slot, ce_tasks, 368);
SATTR_LPIN(struct sattr_slot, op_count, 312);
SATTR_LPIN(struct sattr_slot, last_seq, 320);
SATTR_LPIN(struct sattr_slot, last_count, 336);
SATTR_LPIN(struct sattr_slot, op_digest, 360);
SATTR_LPIN(struct sattr_slot, kch_started, 384);    /* kernel writer: own cache line */
SATTR_LPIN(struct sattr_slot, kch_cur, 408);
SATTR_LPIN(struct sattr_slot, kch_last_ns, 440);
SATTR_LPIN(struct sattr_slot, send_posted, 448);    /* proxy thread: own cache lines */
SATTR_LPIN(struct sattr_slot, net, 448);
SATTR_LPIN(struct sattr_slot, in_state, 512);
SATTR_LPIN(struct sattr_slot, last_progress_ns, 544);
SATTR_LPIN(struct sattr_slot, win_start_ns, 576);
SATTR_LPIN(struct sattr_slot, base_recv_bytes, 648);
SATTR_LPIN(struct sattr_slot, ops, 704);            /* app thread */
SATTR_LPIN(struct sattr_slot, chan, 1216);          /* kernel writer */
SATTR_LPIN(struct sattr_slot, peers, 1728);         /* proxy + app (p2p) */
_Static_assert(sizeof(struct sattr_lane_core) == 256, "lane core: 4 cache lines");
SATTR_LPIN(struct sattr_lane_core, in_state, 64);
SATTR_LPIN(struct sattr_lane_core, win_start_ns, 128);
_Static_assert(sizeof(struct sattr_lane) == SATTR_PROBE_LANE_SIZE, "lane size");
SATTR_LPIN(struct sattr_lane, net, 64);
SATTR_LPIN(struct sattr_lane, peers, 320);
_Static_assert(SATTR_PROBE_LANES_OFF % 64 == 0 && SATTR_PROBE_LANE_SIZE % 64 == 0,
               "lanes start on cache lines");
_Static_assert(SATTR_PROBE_NLANES + 1 < 32, "lane ids fit the handles' 5 bits");
_Static_assert(SATTR_PROBE_FILE_SIZE <= 112 * 1024, "a rank's file stays under 112 KiB");
_Static_assert((SATTR_PROBE_OPRING & (SATTR_PROBE_OPRING - 1)) == 0, "op ring is a power of two");

#endif /* SATTR_PROBE_LAYOUT_H */
