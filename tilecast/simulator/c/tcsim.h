/* The simulator's run loop in C: every policy of tilecast/simulator/simulate.py's POLICIES, with the
 * data replicas of tilecast/simulator/memory.py and the link timelines of tilecast/simulator/links.py.
 * See tcsim.c; the declarations below are also given to cffi (tilecast/simulator/native.py). */
#include <stdint.h>

enum { TCSIM_EAGER, TCSIM_PRIO, TCSIM_RANDOM, TCSIM_WS, TCSIM_LWS, TCSIM_DM, TCSIM_DMDA, TCSIM_DMDAS, TCSIM_DMDASD };
enum { TCSIM_OK, TCSIM_ENOMEM, TCSIM_EROOM, TCSIM_ENOWORKER };

typedef struct {
    /* the graph and the machine */
    int64_t n_tasks;
    int32_t n_workers, n_nodes, n_links, policy;
    const double *dur;            /* n_kinds x n_tasks: what a task takes on each kind */
    const double *est;            /* n_kinds x n_tasks: the dm family's estimates (else unused) */
    const int32_t *worker_kind, *worker_node;
    double overhead;
    double decision_scan, decision_lock;  /* a decision's cost (dmdasd): per queued task read, per other worker
                                           * (Engine.decide) */
    int32_t decision_serial;      /* 1: decisions hold the scheduler, one at a time (queues read under their locks);
                                   * 0: a decision is the deciding thread's time only (a declared priority range) */
    double push_walk;             /* dmdas, dmdasd: s per queued task a sorted insertion walks past, paid by the
                                   * pushing worker before its next task (Engine.walk) */
    double walk_far, walk_knee;   /* dmdas, dmdasd: s per step beyond the first walk_knee steps of an insertion
                                   * (queue_costs.list_walk_s); walk_far 0: push_walk for every step */
    const double *gap_before;     /* per task: s charged before it starts beyond overhead; NULL: none */
    const double *release;        /* per task: s its ending worker spends releasing it before its next task
                                   * (Engine._released; tilecast/simulator/gap_cost.py); NULL: none */
    double gap_ready;             /* with release: s more per successor the ended task makes ready */
    double gap_handoff;           /* s charged before a task starts on another worker than the one whose ended
                                   * task made it ready (Engine.gap_handoff); 0: none */
    const int64_t *pred_ptr;      /* n_tasks + 1 */
    const int32_t *pred;
    /* policy inputs */
    const double *neg;            /* prio, dmdas, dmdasd: each task's sort key (minus its priority); NULL: 0.0 */
    const uint8_t *front;         /* eager: tasks pushed at the front of the queue; NULL: none */
    const int64_t *choice;        /* random: each task's worker */
    const int32_t *proximity;     /* lws: per worker, the n_workers - 1 others in stealing order */
    /* data (has_mem 0: data is everywhere) */
    int32_t has_mem;
    int64_t n_tiles;
    const int64_t *size;          /* n_tiles: bytes */
    uint64_t *valid;              /* n_tiles: bitmask of nodes holding a valid replica (in/out) */
    const double *capacity;       /* n_nodes */
    int64_t *used, *peak;         /* n_nodes (in/out) */
    const int64_t *acc_ptr, *acc_code;  /* per task, its accesses: tile * 4 + mode (1 read, 2 write) */
    const int64_t *read_ptr, *read_tile;
    const double *latency, *inv_bw;     /* n_nodes x n_nodes: a route's latency and 1 / its bottleneck bandwidth */
    const int32_t *route_ptr, *route;   /* CSR over the n_nodes x n_nodes routes: link ids */
    /* results */
    double *start, *end;
    int64_t *where;
    double *log;                  /* src, dst, bytes, start, end of each transfer (owned: tcsim_free) */
    int64_t log_n;                /* doubles in log */
    int64_t n_done, n_evictions, n_writebacks;
    int32_t err;
    int64_t err_arg;              /* the node (TCSIM_EROOM) or task (TCSIM_ENOWORKER) */
    void *priv;
    /* per-worker cache state (tcsim.c's wc_duration; tilecast/simulator/worker_cache.py). wc_hot NULL: each
     * task takes dur; else hot + f * delta, f the cold share of its bytes for the worker that starts it; for a
     * worker with a shared cache (wc_llc > 0), hot + a * near_delta + b * delta, a and b the near and far
     * shares */
    const double *wc_hot, *wc_delta;    /* n_kinds x n_tasks: the hot lane time, cold - hot */
    const double *wc_cache;             /* per worker: the cache bytes within which a tile is hot */
    const int64_t *wc_acc_ptr, *wc_acc_tile, *wc_tile_bytes;  /* the graph's accesses, each tile's bytes */
    int64_t *wc_count;                  /* per worker: bytes accessed so far (in/out) */
    int32_t *wc_last_worker;            /* per tile: the worker that touched it last, -1 none (in/out) */
    int64_t *wc_last_count;             /* per tile: that worker's count before the access (in/out) */
    const double *wc_near_delta;        /* n_kinds x n_tasks: near - hot (delta where a task has no near time) */
    const double *wc_llc;               /* per worker: the shared cache's share per core, 0 none */
    const int64_t *wc_step_bytes;       /* [1]: the bytes a step accesses (a first access's distance) */
    int64_t *wc_total;                  /* [1]: bytes all workers accessed so far (in/out) */
    int64_t *wc_last_total;             /* per tile: wc_total before its last access (in/out) */
    /* prio with push_walk > 0: each task's stage of the priority tree (queue_costs.priority_stages); NULL:
     * the tree's search is not charged */
    const int32_t *stage;
    /* the submitting thread taking its turns on a worker's core (tilecast/simulator/submit_slices.py); sub_at
     * NULL: none. sub_at: per task, when that thread has submitted it (the policy gets it then); the workers
     * are paused until sub_resume; until sub_end, worker sub_sharer waits sub_first_s after the resume and then
     * runs in every other turn of sub_slice_s, its own first */
    const double *sub_at;
    double sub_resume, sub_end, sub_first_s, sub_slice_s;
    int32_t sub_sharer;
} tcsim_t;

int tcsim_run(tcsim_t *s);
void tcsim_free(tcsim_t *s);
/* tilecast.graph.analysis.longest_path_end and tilecast.graph.priorities.bottom_level, same operations */
void tcsim_longest_path_end(int64_t n, const double *w, const int64_t *pred_ptr, const int32_t *pred, double *out);
int tcsim_bottom_level(int64_t n, const double *w, const int64_t *pred_ptr, const int32_t *pred, double *out);
