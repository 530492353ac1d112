/* The simulator's run loop in C (see tilecast/simulator/native.py).
 *
 * It is the Python engine (tilecast/simulator/engine.py) with each policy of
 * tilecast/simulator/policies/, Memory (memory.py) and Links (links.py), step
 * for step, in the same order and with the same double operations (built
 * without -ffast-math and with -ffp-contract=off), so that the results are equal
 * bit for bit; tests/test_sim_native.py compares the two on random graphs and
 * machines for every policy. Where the Python code's form differs:
 *
 * - simpy's clock is a binary heap of (time, event id, task) run with CPython's
 *   heapq algorithm and tuple comparison, so even NaN times pop in simpy's order;
 *   an event's time is now + (end - now), as simpy computes a timeout's;
 * - a node's replicas are a valid bit per tile and, on device nodes, an LRU list
 *   in the order of Memory's dicts (the host is never full: its order is unused);
 * - the tasks holding data on a node are the busy workers' tasks there (and the
 *   task acquiring data), as in the fused loop (fused_deque_model.py);
 * - dmdasd keeps each worker's queue as an array sorted by (priority key, push
 *   count), which pops in the order of the Python heap (the keys are unique);
 *   so does dmdas when its insertions are charged (push_walk > 0), to count the
 *   tasks each one walks past.
 */
#include "tcsim.h"

#include <math.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

typedef struct { double k; int64_t s; int64_t v; } hent;  /* a heap entry: key, tie-break, payload */
typedef struct { hent *a; int64_t n, cap; } heap_t;
typedef struct { int64_t *a; int64_t head, n, cap; } dq_t;  /* ring buffer; cap a power of two */
typedef struct {  /* dmdasd: a worker's queue sorted by (key, push order), entries [head, head + n) */
    double *key;    /* minus the priority */
    double *len;    /* the predicted length of the task (its sum below reads them in a row) */
    int32_t *task;
    int64_t head, n, cap;
    double *fold;   /* fold[i] = the lengths of the first i entries summed in order */
    int64_t folded; /* how many of them are up to date */
} sq_t;

typedef struct {
    jmp_buf jb;
    double now;
    int64_t eid, pushed;
    double sched_free;  /* when the last scheduling decision ends (Engine.sched_free) */
    int64_t scanned;    /* queued tasks the current decision read */
    int dm, da, sorted_q, sorted_decision;
    int use_sq;         /* the sorted queues are sq_t arrays (dmdasd; dmdas with push_walk) */
    double *hold;       /* per worker, when its sorted insertions end (Engine.hold) */
    int pushing;        /* the worker pushing what its ended task released (Engine.pushing), else -1 */
    int32_t *made_by;   /* per task, the worker whose ended task made it ready, -1 none (Engine.made_by) */
    int64_t *stage_count; /* prio: tasks queued per priority stage (queue_costs.StageCount) */
    int64_t stages;       /* prio: stages with tasks queued */
    heap_t events, central;
    heap_t *hq;  /* dmdas: per worker, a heap as the Python policy's */
    dq_t cdq;
    dq_t *dq;
    sq_t *sq;
    uint8_t *busy;
    uint8_t *releasing; /* per worker, releasing its ended task, not yet back in its pop (Engine.releasing) */
    int64_t *cur;
    int32_t *missing;
    int64_t *succ_ptr;
    int32_t *succ;
    double *exp_start, *exp_len, *predicted, *predicted_transfer, *pen, *ends;
    int32_t last_push;
    int32_t *last_pop;
    int32_t *node_workers, *node_workers_ptr;
    /* data */
    double *avail;               /* n_nodes x n_tiles: when the replica is (or will be) there */
    int32_t *lru_prev, *lru_next, *lru_head, *lru_tail;
    uint32_t *stamp;
    uint32_t stamp_now;
    int64_t *victims;
    int64_t victims_cap;
    double *free_at;
    int64_t log_cap;
} priv_t;

static void fail(tcsim_t *s, int err, int64_t arg) {
    s->err = err;
    s->err_arg = arg;
    longjmp(((priv_t *)s->priv)->jb, 1);
}

static void *xalloc(tcsim_t *s, size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) fail(s, TCSIM_ENOMEM, 0);
    return p;
}

static void *xrealloc(tcsim_t *s, void *p, size_t n, size_t size) {
    void *q = realloc(p, (n ? n : 1) * size);
    if (!q) fail(s, TCSIM_ENOMEM, 0);
    return q;
}

/* --- heapq, as CPython's _heapq does it, on tuples (k, s, v) with distinct s ------------------------ */
static inline int h_lt(const hent *a, const hent *b) { return a->k == b->k ? a->s < b->s : a->k < b->k; }

static void h_siftdown(hent *a, int64_t startpos, int64_t pos) {
    hent item = a[pos];
    while (pos > startpos) {
        int64_t parent = (pos - 1) >> 1;
        if (!h_lt(&item, &a[parent])) break;
        a[pos] = a[parent];
        pos = parent;
    }
    a[pos] = item;
}

static void h_siftup(hent *a, int64_t n, int64_t pos) {
    int64_t startpos = pos, child = 2 * pos + 1;
    hent item = a[pos];
    while (child < n) {
        int64_t right = child + 1;
        if (right < n && !h_lt(&a[child], &a[right])) child = right;
        a[pos] = a[child];
        pos = child;
        child = 2 * pos + 1;
    }
    a[pos] = item;
    h_siftdown(a, startpos, pos);
}

static void h_push(tcsim_t *s, heap_t *h, double k, int64_t sq, int64_t v) {
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 16;
        h->a = xrealloc(s, h->a, h->cap, sizeof(hent));
    }
    h->a[h->n].k = k;
    h->a[h->n].s = sq;
    h->a[h->n].v = v;
    h->n++;
    h_siftdown(h->a, 0, h->n - 1);
}

static hent h_pop(heap_t *h) {
    hent last = h->a[--h->n];
    if (h->n) {
        hent top = h->a[0];
        h->a[0] = last;
        h_siftup(h->a, h->n, 0);
        return top;
    }
    return last;
}

/* --- deques ------------------------------------------------------------------------------------------ */
static void dq_grow(tcsim_t *s, dq_t *q) {
    int64_t cap = q->cap ? 2 * q->cap : 16;
    int64_t *a = xalloc(s, cap, sizeof(int64_t));
    for (int64_t i = 0; i < q->n; i++) a[i] = q->a[(q->head + i) & (q->cap - 1)];
    free(q->a);
    q->a = a;
    q->head = 0;
    q->cap = cap;
}

static inline void dq_append(tcsim_t *s, dq_t *q, int64_t v) {
    if (q->n == q->cap) dq_grow(s, q);
    q->a[(q->head + q->n) & (q->cap - 1)] = v;
    q->n++;
}

static inline void dq_appendleft(tcsim_t *s, dq_t *q, int64_t v) {
    if (q->n == q->cap) dq_grow(s, q);
    q->head = (q->head - 1) & (q->cap - 1);
    q->a[q->head] = v;
    q->n++;
}

static inline int64_t dq_popleft(dq_t *q) {
    int64_t v = q->a[q->head];
    q->head = (q->head + 1) & (q->cap - 1);
    q->n--;
    return v;
}

/* --- sorted queues (dmdasd): by (key, push order) --------------------------------------------------- */
static int64_t sq_count_le(const sq_t *q, double k) {  /* entries with key <= k (a prefix) */
    int64_t lo = 0, hi = q->n;
    const double *key = q->key + q->head;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (key[mid] <= k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void sq_place(tcsim_t *s, sq_t *q, int64_t cap) {  /* the entries centred in an array of cap */
    int64_t h = (cap - q->n) / 2;
    if (cap != q->cap) {
        double *key = xalloc(s, cap, sizeof(double)), *len = xalloc(s, cap, sizeof(double));
        int32_t *task = xalloc(s, cap, sizeof(int32_t));
        memcpy(key + h, q->key + q->head, q->n * sizeof(double));
        memcpy(len + h, q->len + q->head, q->n * sizeof(double));
        memcpy(task + h, q->task + q->head, q->n * sizeof(int32_t));
        free(q->key);
        free(q->len);
        free(q->task);
        q->key = key;
        q->len = len;
        q->task = task;
        q->fold = xrealloc(s, q->fold, cap + 1, sizeof(double));
        q->fold[0] = 0.0;
        q->cap = cap;
    } else {
        memmove(q->key + h, q->key + q->head, q->n * sizeof(double));
        memmove(q->len + h, q->len + q->head, q->n * sizeof(double));
        memmove(q->task + h, q->task + q->head, q->n * sizeof(int32_t));
    }
    q->head = h;
}

static void sq_insert(tcsim_t *s, sq_t *q, double k, double len, int64_t task) {
    /* after every entry of key <= k (they all came earlier); the shorter side of the array moves */
    int64_t i = sq_count_le(q, k), h = q->head, n = q->n;
    if (i < n - i && h > 0) {  /* the first i entries one place down */
        memmove(q->key + h - 1, q->key + h, i * sizeof(double));
        memmove(q->len + h - 1, q->len + h, i * sizeof(double));
        memmove(q->task + h - 1, q->task + h, i * sizeof(int32_t));
        h = --q->head;
    } else {  /* the last n - i entries one place up */
        if (h + n == q->cap) {
            sq_place(s, q, n + 1 > q->cap / 2 ? (q->cap ? 2 * q->cap : 16) : q->cap);
            h = q->head;
        }
        memmove(q->key + h + i + 1, q->key + h + i, (n - i) * sizeof(double));
        memmove(q->len + h + i + 1, q->len + h + i, (n - i) * sizeof(double));
        memmove(q->task + h + i + 1, q->task + h + i, (n - i) * sizeof(int32_t));
    }
    q->key[h + i] = k;
    q->len[h + i] = len;
    q->task[h + i] = (int32_t)task;
    q->n++;
    if (q->folded > i) q->folded = i;  /* the sums of the entries before it stay */
}

static inline int64_t sq_popleft(sq_t *q) {
    int64_t v = q->task[q->head];
    q->head++;
    q->n--;
    q->folded = 0;  /* the sums start at the new first entry */
    if (!q->n) q->head = q->cap / 2;  /* room on both sides */
    return v;
}

/* --- links (Links.estimate, Links.transfer) ------------------------------------------------------------ */
static inline double link_estimate(const tcsim_t *s, int src, int dst, int64_t b) {
    int64_t i = (int64_t)src * s->n_nodes + dst;
    return s->latency[i] + (double)b * s->inv_bw[i];
}

static double link_transfer(tcsim_t *s, priv_t *p, int src, int dst, int64_t nbytes, double not_before) {
    int64_t pair = (int64_t)src * s->n_nodes + dst;
    double *free_at = p->free_at;
    double start = not_before;
    for (int32_t j = s->route_ptr[pair]; j < s->route_ptr[pair + 1]; j++)
        if (free_at[s->route[j]] > start) start = free_at[s->route[j]];
    double end = start + s->latency[pair] + (double)nbytes * s->inv_bw[pair];
    for (int32_t j = s->route_ptr[pair]; j < s->route_ptr[pair + 1]; j++) free_at[s->route[j]] = end;
    if (s->log_n + 5 > p->log_cap) {
        p->log_cap = p->log_cap ? 2 * p->log_cap : 5 * 1024;
        s->log = xrealloc(s, s->log, p->log_cap, sizeof(double));
    }
    double *l = s->log + s->log_n;
    l[0] = src;
    l[1] = dst;
    l[2] = (double)nbytes;
    l[3] = start;
    l[4] = end;
    s->log_n += 5;
    return end;
}

/* --- data replicas (Memory) ------------------------------------------------------------------------------ */
static inline int bit_index(uint64_t low) { return __builtin_ctzll(low); }

static int mem_source(const tcsim_t *s, uint64_t v, int dst, int64_t b) {  /* Memory._source */
    if ((v & (v - 1)) == 0) return 63 - __builtin_clzll(v);
    int best = -1;
    double best_t = INFINITY;
    while (v) {
        uint64_t low = v & (~v + 1);
        int src = bit_index(low);
        double t = link_estimate(s, src, dst, b);
        if (t < best_t) {
            best = src;
            best_t = t;
        }
        v ^= low;
    }
    return best;
}

#define AV(p, s, node, tile) ((p)->avail[(int64_t)(node) * (s)->n_tiles + (tile)])
#define LP(p, s, node, tile) ((p)->lru_prev[(int64_t)(node) * (s)->n_tiles + (tile)])
#define LN(p, s, node, tile) ((p)->lru_next[(int64_t)(node) * (s)->n_tiles + (tile)])

static inline void lru_append(tcsim_t *s, priv_t *p, int nd, int64_t tile) {  /* at the most recent end */
    if (nd == 0) return;
    int32_t tail = p->lru_tail[nd];
    LP(p, s, nd, tile) = tail;
    LN(p, s, nd, tile) = -1;
    if (tail >= 0) LN(p, s, nd, tail) = (int32_t)tile;
    else p->lru_head[nd] = (int32_t)tile;
    p->lru_tail[nd] = (int32_t)tile;
}

static inline void lru_remove(tcsim_t *s, priv_t *p, int nd, int64_t tile) {
    if (nd == 0) return;
    int32_t a = LP(p, s, nd, tile), b = LN(p, s, nd, tile);
    if (a >= 0) LN(p, s, nd, a) = b;
    else p->lru_head[nd] = b;
    if (b >= 0) LP(p, s, nd, b) = a;
    else p->lru_tail[nd] = a;
}

static void mark_tiles(tcsim_t *s, priv_t *p, int64_t task) {
    for (int64_t j = s->acc_ptr[task]; j < s->acc_ptr[task + 1]; j++) p->stamp[s->acc_code[j] >> 2] = p->stamp_now;
}

/* Memory._make_room: 0 when done, -1 when the node cannot make room (nothing changed then). */
static int make_room(tcsim_t *s, priv_t *p, int nd, int64_t nbytes, double now, int64_t acquiring) {
    double cap = s->capacity[nd];
    if ((double)(s->used[nd] + nbytes) <= cap) return 0;
    if (++p->stamp_now == 0) {  /* wrapped: clear the marks */
        memset(p->stamp, 0, s->n_tiles * sizeof(uint32_t));
        p->stamp_now = 1;
    }
    for (int32_t j = p->node_workers_ptr[nd]; j < p->node_workers_ptr[nd + 1]; j++) {
        int32_t w = p->node_workers[j];
        if (p->busy[w]) mark_tiles(s, p, p->cur[w]);
    }
    if (acquiring >= 0) mark_tiles(s, p, acquiring);
    double need = (double)(s->used[nd] + nbytes) - cap;
    int64_t nv = 0;
    for (int32_t tile = p->lru_head[nd]; tile >= 0; tile = LN(p, s, nd, tile)) {
        if (p->stamp[tile] == p->stamp_now) continue;
        if (nv == p->victims_cap) {
            p->victims_cap = p->victims_cap ? 2 * p->victims_cap : 64;
            p->victims = xrealloc(s, p->victims, p->victims_cap, sizeof(int64_t));
        }
        p->victims[nv++] = tile;
        need -= (double)s->size[tile];
        if (need <= 0) break;
    }
    if (need > 0) return -1;
    uint64_t bit = (uint64_t)1 << nd;
    for (int64_t i = 0; i < nv; i++) {
        int64_t tile = p->victims[i];
        double ready = AV(p, s, nd, tile);
        lru_remove(s, p, nd, tile);
        s->used[nd] -= s->size[tile];
        s->n_evictions++;
        if (s->valid[tile] == bit) {  /* the only valid copy: written back to the host first */
            double end = link_transfer(s, p, nd, 0, s->size[tile], ready > now ? ready : now);
            s->valid[tile] = 1;
            AV(p, s, 0, tile) = end;
            s->used[0] += s->size[tile];
            if (s->used[0] > s->peak[0]) s->peak[0] = s->used[0];
            s->n_writebacks++;
        } else {
            s->valid[tile] &= ~bit;
        }
    }
    return 0;
}

/* Memory._bring (the tile is not on nd): when its replica is there */
static double bring(tcsim_t *s, priv_t *p, int64_t tile, int nd, double now, int fetch, int64_t acquiring) {
    int64_t sz = s->size[tile];
    if ((double)(s->used[nd] + sz) > s->capacity[nd] && make_room(s, p, nd, sz, now, acquiring) < 0)
        fail(s, TCSIM_EROOM, nd);
    uint64_t v = s->valid[tile];
    double ready;
    if (v && fetch) {
        int src = (v & (v - 1)) == 0 ? 63 - __builtin_clzll(v) : mem_source(s, v, nd, sz);
        double since = AV(p, s, src, tile);
        ready = link_transfer(s, p, src, nd, sz, since > now ? since : now);
    } else {
        ready = now;
    }
    AV(p, s, nd, tile) = ready;
    lru_append(s, p, nd, tile);
    s->valid[tile] = v | ((uint64_t)1 << nd);
    int64_t u = s->used[nd] + sz;
    s->used[nd] = u;
    if (u > s->peak[nd]) s->peak[nd] = u;
    return ready;
}

static void prefetch(tcsim_t *s, priv_t *p, int64_t task, int nd, double now) {  /* Memory.prefetch */
    for (int64_t j = s->read_ptr[task]; j < s->read_ptr[task + 1]; j++) {
        int64_t tile = s->read_tile[j];
        if ((s->valid[tile] >> nd) & 1) continue;
        int64_t sz = s->size[tile];
        if ((double)(s->used[nd] + sz) > s->capacity[nd] && make_room(s, p, nd, sz, now, -1) < 0)
            return;  /* no room now: the fetch at start will retry */
        bring(s, p, tile, nd, now, 1, -1);
    }
}

static double acquire(tcsim_t *s, priv_t *p, int64_t task, int nd, double now) {  /* Memory.acquire */
    double ready = now;
    uint64_t bit = (uint64_t)1 << nd;
    for (int64_t j = s->acc_ptr[task]; j < s->acc_ptr[task + 1]; j++) {
        int64_t c = s->acc_code[j], tile = c >> 2;
        double t;
        if (s->valid[tile] & bit) {  /* held: now the most recently used */
            t = AV(p, s, nd, tile);
            if (nd) {
                lru_remove(s, p, nd, tile);
                lru_append(s, p, nd, tile);
            }
        } else {
            t = bring(s, p, tile, nd, now, (int)(c & 1), task);
        }
        if (t > ready) ready = t;
        if ((c & 2) && s->valid[tile] != bit) {  /* a write: drop every other replica */
            uint64_t v = s->valid[tile] & ~bit;
            while (v) {
                uint64_t low = v & (~v + 1);
                int d = bit_index(low);
                lru_remove(s, p, d, tile);
                s->used[d] -= s->size[tile];
                v ^= low;
            }
            s->valid[tile] = bit;
        }
    }
    return ready;
}

/* Memory.penalty, per node, summed in read order */
static void penalty(tcsim_t *s, priv_t *p, int64_t task) {
    int nn = s->n_nodes;
    double *pen = p->pen;
    for (int d = 0; d < nn; d++) pen[d] = 0.0;
    for (int64_t j = s->read_ptr[task]; j < s->read_ptr[task + 1]; j++) {
        int64_t tile = s->read_tile[j];
        uint64_t v = s->valid[tile];
        if (!v) continue;
        int64_t b = s->size[tile];
        for (int d = 0; d < nn; d++) {
            double c = (v >> d) & 1 ? 0.0 : link_estimate(s, mem_source(s, v, d, b), d, b);
            pen[d] = pen[d] + c;
        }
    }
}

/* --- per-worker cache state (WorkerCache, tilecast/simulator/worker_cache.py) ----------------------------- */
/* Task t starts on worker w: hot + f * (cold - hot), f the share of its bytes not hot for w (w touched the tile
 * last, and has accessed at most its cache's bytes since); records the accesses. */
static double wc_duration(tcsim_t *s, int w, int64_t t) {
    int64_t c = s->wc_count[w], g = s->wc_total[0], cold = 0, far = 0, total = 0;
    double cap = s->wc_cache[w], llc = s->wc_llc[w];
    for (int64_t j = s->wc_acc_ptr[t]; j < s->wc_acc_ptr[t + 1]; j++) {
        int64_t x = s->wc_acc_tile[j], b = s->wc_tile_bytes[x];
        if (s->wc_last_worker[x] != w || (double)(c - s->wc_last_count[x]) > cap) {
            cold += b;
            int64_t dist = s->wc_last_worker[x] >= 0 ? g - s->wc_last_total[x] : s->wc_step_bytes[0];
            if ((double)dist > llc) far += b;
        }
        total += b;
        s->wc_last_worker[x] = w;
        s->wc_last_count[x] = c;
        s->wc_last_total[x] = g;
        c += b;
        g += b;
    }
    s->wc_count[w] = c;
    s->wc_total[0] = g;
    int64_t i = (int64_t)s->worker_kind[w] * s->n_tasks + t;
    if (!total) return s->wc_hot[i] + 0.0 * s->wc_delta[i];
    if (llc > 0.0)
        return s->wc_hot[i] + ((double)(cold - far) / (double)total) * s->wc_near_delta[i]
               + ((double)far / (double)total) * s->wc_delta[i];
    return s->wc_hot[i] + ((double)cold / (double)total) * s->wc_delta[i];
}

/* --- the submitting thread's turns (SubmitSlices.run, tilecast/simulator/submit_slices.py) ------------------- */
static void slice_run(const tcsim_t *s, int w, double *bp, double *ep, double work) {
    double t = *bp, resume = s->sub_resume, end = s->sub_end, start = -1.0;
    if (t < resume) t = resume;
    if (w != s->sub_sharer || t >= end) {
        *bp = t;
        *ep = t + work;
        return;
    }
    double first = resume + s->sub_first_s, sl = s->sub_slice_s;  /* the sharer's first turn ends */
    while (t < end) {
        double turn_end;
        if (t < first) turn_end = first;
        else {
            double k = floor((t - first) / sl);  /* even: the submitting thread's turn; odd: the sharer's */
            turn_end = first + (k + 1.0) * sl;
            if (turn_end <= t) {  /* t is a turn's end that the division rounded down */
                k = k + 1.0;
                turn_end = first + (k + 1.0) * sl;
            }
            if (fmod(k, 2.0) == 0.0) {
                t = turn_end < end ? turn_end : end;
                continue;
            }
        }
        if (start < 0.0) start = t;
        double room = turn_end - t;
        if (work <= room) {
            *bp = start;
            *ep = t + work;
            return;
        }
        work -= room;
        t = turn_end;
    }
    if (start < 0.0) start = t;
    *bp = start;
    *ep = t + work;
}

/* --- the engine ----------------------------------------------------------------------------------------- */
static void begin(tcsim_t *s, priv_t *p, int w, int64_t t) {  /* Engine._begin */
    double now = p->now;
    double b = now >= p->sched_free ? now : p->sched_free;
    if (p->hold[w] > b) b = p->hold[w];
    b = b + s->overhead;
    if (s->gap_before) b = b + s->gap_before[t];
    if (s->gap_handoff > 0.0 && p->made_by[t] >= 0 && p->made_by[t] != w) b = b + s->gap_handoff;
    if (s->has_mem) {
        p->cur[w] = t;
        double ready = acquire(s, p, t, s->worker_node[w], now);
        if (ready > b) b = ready;
    }
    double d = s->wc_hot ? wc_duration(s, w, t) : s->dur[(int64_t)s->worker_kind[w] * s->n_tasks + t];
    double e;
    if (s->sub_at && b < s->sub_end) slice_run(s, w, &b, &e, d);
    else e = b + d;
    if (p->dm) {  /* DequeModel.started */
        double left = p->exp_len[w] - p->predicted_transfer[t];
        p->exp_len[w] = left - p->predicted[t];
        p->exp_start[w] = b + p->predicted[t];
    }
    p->busy[w] = 1;
    p->cur[w] = t;
    s->start[t] = b;
    s->end[t] = e;
    s->where[t] = w;
    h_push(s, &p->events, now + (e - now), p->eid++, t);  /* simpy: at now + delay */
}

static int64_t policy_pop(tcsim_t *s, priv_t *p, int w);

/* Engine.walk: worker `by` searched `steps` steps through a queue; the submitting thread (-1) is not charged */
static void walk(tcsim_t *s, priv_t *p, int by, int64_t steps) {
    if (by >= 0 && steps) {
        double h = p->hold[by], now = p->now;
        p->hold[by] = (now >= h ? now : h) + (double)steps * s->push_walk;
    }
}

static inline int64_t tree_levels(int64_t n) {  /* queue_costs.tree_levels: n.bit_length() */
    int64_t l = 0;
    while (n) {
        l++;
        n >>= 1;
    }
    return l;
}

static int64_t stage_add(tcsim_t *s, priv_t *p, int64_t t) {  /* StageCount.add */
    int64_t levels = tree_levels(p->stages);
    if (p->stage_count[s->stage[t]]++ == 0) p->stages++;
    return levels;
}

static int64_t stage_remove(tcsim_t *s, priv_t *p, int64_t t) {  /* StageCount.remove */
    int64_t levels = tree_levels(p->stages);
    if (--p->stage_count[s->stage[t]] == 0) p->stages--;
    return levels;
}

static void wake(tcsim_t *s, priv_t *p, int w) {  /* Engine.wake */
    if (p->busy[w] || w == p->pushing || p->releasing[w]) return;
    int64_t t = policy_pop(s, p, w);
    if (t >= 0) begin(s, p, w, t);
}

static inline int first_idle(const tcsim_t *s, const priv_t *p) {  /* Engine.wake_first_idle: not the pushing one */
    for (int w = 0; w < s->n_workers; w++)
        if (!p->busy[w] && w != p->pushing && !p->releasing[w]) return w;
    return -1;
}

static int ws_victim(tcsim_t *s, priv_t *p, int w) {
    int n = s->n_workers;
    if (s->policy == TCSIM_LWS) {  /* lws_select_victim */
        const int32_t *prox = s->proximity + (int64_t)w * (n - 1);
        for (int i = 0; i < n - 1; i++)
            if (p->dq[prox[i]].n && (p->busy[prox[i]] || p->releasing[prox[i]])) return prox[i];
        return -1;
    }
    int start = p->last_pop[w], v = start, found = -1;  /* select_victim_round_robin */
    for (;;) {
        if (p->dq[v].n && (p->busy[v] || p->releasing[v])) {
            found = v;
            break;
        }
        v = (v + 1) % n;
        if (v == start) break;
    }
    p->last_pop[w] = (v + 1) % n;
    return found;
}

static int64_t policy_pop(tcsim_t *s, priv_t *p, int w) {
    switch (s->policy) {
    case TCSIM_EAGER:
        return p->cdq.n ? dq_popleft(&p->cdq) : -1;
    case TCSIM_PRIO: {  /* Prio.pop */
        if (!p->central.n) return -1;
        int64_t t = h_pop(&p->central).v;
        if (s->stage) walk(s, p, w, stage_remove(s, p, t));
        return t;
    }
    case TCSIM_WS:
    case TCSIM_LWS: {
        if (p->dq[w].n) return dq_popleft(&p->dq[w]);
        int v = ws_victim(s, p, w);
        return v >= 0 ? dq_popleft(&p->dq[v]) : -1;
    }
    case TCSIM_DMDAS:
        if (p->use_sq) return p->sq[w].n ? sq_popleft(&p->sq[w]) : -1;
        return p->hq[w].n ? h_pop(&p->hq[w]).v : -1;
    case TCSIM_DMDASD:
        return p->sq[w].n ? sq_popleft(&p->sq[w]) : -1;
    default:  /* random, dm, dmda */
        return p->dq[w].n ? dq_popleft(&p->dq[w]) : -1;
    }
}

static double prev_exp_len(tcsim_t *s, priv_t *p, int w, int64_t task) {  /* DequeModel._prev_exp_len */
    sq_t *q = &p->sq[w];
    if (!q->n) return 0.0;
    double neg = s->neg ? s->neg[task] : 0.0;
    int64_t k = sq_count_le(q, neg);
    if (!k) return 0.0;
    if (k == q->n) return p->exp_len[w];
    p->scanned += k;  /* StarPU reads each one's predicted length */
    /* total = 0.0; total += predicted of each of the first k entries, in order: kept between calls
     * (the first entries' sums stand until an entry is inserted before them or the first one is popped) */
    const double *len = q->len + q->head;
    for (int64_t i = q->folded; i < k; i++) q->fold[i + 1] = q->fold[i] + len[i];
    if (q->folded < k) q->folded = k;
    return q->fold[k];
}

static void dm_push(tcsim_t *s, priv_t *p, int64_t task, int by) {  /* DequeModel.push */
    double now = p->now;
    int n = s->n_workers, da = p->da;
    const int32_t *wnode = s->worker_node;
    double *pen = p->pen, *ends = p->ends, *exp_start = p->exp_start, *exp_len = p->exp_len;
    if (da && s->has_mem) penalty(s, p, task);  /* else pen stays 0 */
    double best_end = INFINITY;
    p->scanned = 0;
    for (int w = 0; w < n; w++) {  /* compute_all_performance_predictions */
        double es = exp_start[w];
        if (es < now) es = now;
        double st = es + (p->sorted_decision ? prev_exp_len(s, p, w, task) : exp_len[w]);
        if (da) {
            double a = now + pen[wnode[w]];
            if (a > st) st = a;
        }
        double e = st + s->est[(int64_t)s->worker_kind[w] * s->n_tasks + task];
        ends[w] = e;
        if (e < best_end) best_end = e;
    }
    int bw = -1;
    double bf = 0.0;
    for (int w = 0; w < n; w++) {  /* _dmda_push_task */
        double f = ends[w] - best_end;
        if (da) f = f + pen[wnode[w]];
        if (bw == -1 || f < bf) {
            bw = w;
            bf = f;
        }
    }
    if (bw < 0 || !(ends[bw] < INFINITY)) fail(s, TCSIM_ENOWORKER, task);
    int w = bw, nd = wnode[w];
    double row = s->est[(int64_t)s->worker_kind[w] * s->n_tasks + task];
    double es = exp_start[w];  /* push_task_on_best_worker */
    if (es < now) es = now;
    exp_start[w] = es;
    double qend = es + exp_len[w];
    double a = now + pen[nd];
    double tr = a < qend ? 0.0 : a - qend;
    exp_len[w] += tr;
    exp_len[w] += row;
    p->predicted[task] = row;
    p->predicted_transfer[task] = tr;
    int64_t qlen = p->use_sq ? p->sq[w].n : p->sorted_q ? p->hq[w].n : p->dq[w].n;
    if (s->has_mem && (qlen || p->busy[w])) prefetch(s, p, task, nd, now);
    if (p->sorted_decision) {  /* Engine.decide: every worker's queue locked but the deciding worker's own; in the
                                  * deciding worker's thread after its earlier work, before the insertion */
        double cost = (double)(n - (by >= 0 ? 1 : 0)) * s->decision_lock + (double)p->scanned * s->decision_scan;
        if (cost > 0.0) {
            double from = s->decision_serial ? (now >= p->sched_free ? now : p->sched_free) : now;
            if (by >= 0) {
                if (p->hold[by] > from) from = p->hold[by];
                p->hold[by] = from + cost;
            }
            if (s->decision_serial) p->sched_free = from + cost;
        }
    }
    if (p->use_sq && s->push_walk > 0.0) {  /* Engine.walk: _starpu_fifo_push_sorted_task's walk */
        sq_t *q = &p->sq[w];
        double k = s->neg ? s->neg[task] : 0.0;
        int64_t walked = 0;
        if (q->n && !(q->key[q->head] == k && q->key[q->head + q->n - 1] == k)) walked = sq_count_le(q, k);
        if (by >= 0 && walked) {
            double h = p->hold[by], k = (double)walked, cost;
            if (s->walk_far > 0.0 && k > s->walk_knee)  /* queue_costs.list_walk_s */
                cost = s->walk_knee * s->push_walk + (k - s->walk_knee) * s->walk_far;
            else
                cost = k * s->push_walk;
            p->hold[by] = (now >= h ? now : h) + cost;
        }
    }
    if (p->use_sq) sq_insert(s, &p->sq[w], s->neg ? s->neg[task] : 0.0, row, task);
    else if (p->sorted_q) h_push(s, &p->hq[w], s->neg ? s->neg[task] : 0.0, ++p->pushed, task);
    else dq_append(s, &p->dq[w], task);
    if (!p->busy[w]) wake(s, p, w);
}

static void policy_push(tcsim_t *s, priv_t *p, int64_t task, int by) {
    int w;
    switch (s->policy) {
    case TCSIM_EAGER:
        if (s->front && s->front[task]) dq_appendleft(s, &p->cdq, task);
        else dq_append(s, &p->cdq, task);
        if ((w = first_idle(s, p)) >= 0) wake(s, p, w);
        return;
    case TCSIM_PRIO:
        if (s->stage) walk(s, p, by, stage_add(s, p, task));
        p->pushed++;
        h_push(s, &p->central, s->neg[task], p->pushed, task);
        if ((w = first_idle(s, p)) >= 0) wake(s, p, w);
        return;
    case TCSIM_RANDOM:
        w = (int)s->choice[task];
        dq_append(s, &p->dq[w], task);
        wake(s, p, w);
        return;
    case TCSIM_WS:
    case TCSIM_LWS:
        if (by < 0) by = p->last_push = (p->last_push + 1) % s->n_workers;
        dq_append(s, &p->dq[by], task);
        if (p->busy[by] || p->releasing[by]) {
            if ((w = first_idle(s, p)) >= 0) wake(s, p, w);  /* a thief */
        } else
            wake(s, p, by);
        return;
    default:
        dm_push(s, p, task, by);
    }
}

/* Engine._push: to the policy, or, with the submitting thread's turns, once it has submitted the task: an event
 * whose value is -(task + 1) */
static void submit_push(tcsim_t *s, priv_t *p, int64_t task, int by) {
    if (s->sub_at) {
        double at = s->sub_at[task], now = p->now;
        if (at > now) {
            h_push(s, &p->events, now + (at - now), p->eid++, -(task + 1));
            return;
        }
    }
    policy_push(s, p, task, by);
}

static void released(priv_t *p, int w, double cost) {  /* Engine._released */
    if (cost > 0.0) {
        double h = p->hold[w], now = p->now;
        p->hold[w] = (now >= h ? now : h) + cost;
    }
}

static void pop_next(tcsim_t *s, priv_t *p, int w) {  /* Engine._pop_next */
    p->releasing[w] = 0;
    if (!p->busy[w]) {
        int64_t nxt = policy_pop(s, p, w);
        if (nxt >= 0) begin(s, p, w, nxt);
    }
}

static void finish(tcsim_t *s, priv_t *p, int64_t t) {  /* Engine._finish */
    int w = (int)s->where[t];
    p->busy[w] = 0;
    s->n_done++;
    if (p->dm && p->exp_start[w] < p->now) p->exp_start[w] = p->now;  /* DequeModel.finished */
    if (s->release) {  /* before its pushes, as Engine._finish */
        double cost = s->release[t];
        if (s->gap_ready > 0.0) {
            int64_t k = 0;
            for (int64_t j = p->succ_ptr[t]; j < p->succ_ptr[t + 1]; j++)
                if (p->missing[p->succ[j]] == 1) k++;
            cost = cost + (double)k * s->gap_ready;
        }
        released(p, w, cost);
    }
    /* Policy.pops_after_pushing: eager, prio, ws, lws */
    int after = s->policy == TCSIM_EAGER || s->policy == TCSIM_PRIO || s->policy == TCSIM_WS
                || s->policy == TCSIM_LWS;
    if (after) p->releasing[w] = 1;
    if (s->push_walk > 0.0 || after) p->pushing = w;
    for (int64_t j = p->succ_ptr[t]; j < p->succ_ptr[t + 1]; j++) {
        int32_t x = p->succ[j];
        if (--p->missing[x] == 0) {
            p->made_by[x] = w;
            submit_push(s, p, x, w);
        }
    }
    p->pushing = -1;
    if (after) {
        double now = p->now;
        if (p->hold[w] > now) {  /* it pops once it has released its task: an event, -(n_tasks + 1 + w) */
            h_push(s, &p->events, now + (p->hold[w] - now), p->eid++, -(s->n_tasks + 1 + w));
            return;
        }
    }
    pop_next(s, p, w);
}

/* successors sorted by id: the transpose of the predecessor lists (tilecast.graph.deps.successors) */
static void transpose(tcsim_t *s, int64_t n, const int64_t *pred_ptr, const int32_t *pred, int64_t **ptr_out,
                      int32_t **succ_out) {
    int64_t m = pred_ptr[n];
    int64_t *ptr = xalloc(s, n + 1, sizeof(int64_t));
    int32_t *succ = xalloc(s, m, sizeof(int32_t));
    *ptr_out = ptr;
    *succ_out = succ;
    for (int64_t j = 0; j < m; j++) ptr[pred[j] + 1]++;
    for (int64_t i = 0; i < n; i++) ptr[i + 1] += ptr[i];
    int64_t *fill = xalloc(s, n + 1, sizeof(int64_t));
    memcpy(fill, ptr, (n + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = pred_ptr[i]; j < pred_ptr[i + 1]; j++) succ[fill[pred[j]]++] = (int32_t)i;
    free(fill);
}

int tcsim_run(tcsim_t *s) {
    priv_t *p = calloc(1, sizeof(priv_t));
    if (!p) return s->err = TCSIM_ENOMEM;
    s->priv = p;
    s->err = TCSIM_OK;
    if (setjmp(p->jb)) return s->err;
    int64_t n = s->n_tasks;
    int nw = s->n_workers, nn = s->n_nodes;
    int pol = s->policy;
    p->dm = pol >= TCSIM_DM;
    p->da = pol >= TCSIM_DMDA;
    p->sorted_q = pol >= TCSIM_DMDAS;
    p->sorted_decision = pol == TCSIM_DMDASD;
    p->use_sq = p->sorted_decision || (p->sorted_q && s->push_walk > 0.0);
    p->pushing = -1;
    if (s->stage) {
        int64_t most = -1;
        for (int64_t i = 0; i < n; i++)
            if (s->stage[i] > most) most = s->stage[i];
        p->stage_count = xalloc(s, most + 1, sizeof(int64_t));
    }
    transpose(s, n, s->pred_ptr, s->pred, &p->succ_ptr, &p->succ);
    p->missing = xalloc(s, n, sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) p->missing[i] = (int32_t)(s->pred_ptr[i + 1] - s->pred_ptr[i]);
    p->made_by = xalloc(s, n, sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) p->made_by[i] = -1;
    p->busy = xalloc(s, nw, 1);
    p->releasing = xalloc(s, nw, 1);
    p->hold = xalloc(s, nw, sizeof(double));
    p->cur = xalloc(s, nw, sizeof(int64_t));
    p->dq = xalloc(s, nw, sizeof(dq_t));
    p->sq = xalloc(s, nw, sizeof(sq_t));
    p->hq = xalloc(s, nw, sizeof(heap_t));
    p->last_pop = xalloc(s, nw, sizeof(int32_t));
    p->exp_start = xalloc(s, nw, sizeof(double));
    p->exp_len = xalloc(s, nw, sizeof(double));
    p->ends = xalloc(s, nw, sizeof(double));
    p->pen = xalloc(s, nn, sizeof(double));
    if (p->dm) {
        p->predicted = xalloc(s, n, sizeof(double));
        p->predicted_transfer = xalloc(s, n, sizeof(double));
    }
    p->node_workers_ptr = xalloc(s, nn + 1, sizeof(int32_t));
    p->node_workers = xalloc(s, nw, sizeof(int32_t));
    for (int w = 0; w < nw; w++) p->node_workers_ptr[s->worker_node[w] + 1]++;
    for (int d = 0; d < nn; d++) p->node_workers_ptr[d + 1] += p->node_workers_ptr[d];
    {
        int32_t *fill = xalloc(s, nn + 1, sizeof(int32_t));
        memcpy(fill, p->node_workers_ptr, (nn + 1) * sizeof(int32_t));
        for (int w = 0; w < nw; w++) p->node_workers[fill[s->worker_node[w]]++] = w;
        free(fill);
    }
    if (s->has_mem) {
        int64_t nt = s->n_tiles;
        p->avail = xalloc(s, (size_t)nn * nt, sizeof(double));  /* host replicas start at 0.0 */
        p->lru_prev = malloc((size_t)nn * nt * sizeof(int32_t) + 1);
        p->lru_next = malloc((size_t)nn * nt * sizeof(int32_t) + 1);
        if (!p->lru_prev || !p->lru_next) fail(s, TCSIM_ENOMEM, 0);
        p->lru_head = xalloc(s, nn, sizeof(int32_t));
        p->lru_tail = xalloc(s, nn, sizeof(int32_t));
        for (int d = 0; d < nn; d++) p->lru_head[d] = p->lru_tail[d] = -1;
        p->stamp = xalloc(s, nt, sizeof(uint32_t));
        p->free_at = xalloc(s, s->n_links, sizeof(double));
        /* replicas already on device nodes (none from simulate: persistent tiles start on the host) */
        for (int d = 1; d < nn; d++)
            for (int64_t tile = 0; tile < nt; tile++)
                if ((s->valid[tile] >> d) & 1) lru_append(s, p, d, tile);
    }
    for (int64_t t = 0; t < n; t++)
        if (p->missing[t] == 0) submit_push(s, p, t, -1);
    while (p->events.n) {
        hent ev = h_pop(&p->events);
        p->now = ev.k;
        if (ev.v < -n) pop_next(s, p, (int)(-ev.v - n - 1));  /* Engine._released_all */
        else if (ev.v < 0) policy_push(s, p, -ev.v - 1, -1);  /* Engine._submitted */
        else finish(s, p, ev.v);
    }
    return TCSIM_OK;
}

void tcsim_free(tcsim_t *s) {
    priv_t *p = s->priv;
    if (p) {
        free(p->events.a);
        free(p->central.a);
        free(p->cdq.a);
        if (p->dq)
            for (int w = 0; w < s->n_workers; w++) free(p->dq[w].a);
        if (p->hq)
            for (int w = 0; w < s->n_workers; w++) free(p->hq[w].a);
        if (p->sq)
            for (int w = 0; w < s->n_workers; w++) {
                free(p->sq[w].key);
                free(p->sq[w].len);
                free(p->sq[w].task);
                free(p->sq[w].fold);
            }
        void *all[] = {p->dq, p->sq, p->hq, p->busy, p->releasing, p->cur, p->missing, p->succ_ptr, p->succ,
                       p->exp_start, p->exp_len, p->predicted, p->predicted_transfer, p->pen, p->ends, p->last_pop,
                       p->node_workers, p->node_workers_ptr, p->avail, p->lru_prev, p->lru_next, p->lru_head,
                       p->lru_tail, p->stamp, p->victims, p->free_at, p->hold, p->stage_count, p->made_by};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) free(all[i]);
        free(p);
        s->priv = NULL;
    }
    free(s->log);
    s->log = NULL;
    s->log_n = 0;
}

/* --- graph sweeps --------------------------------------------------------------------------------------- */
void tcsim_longest_path_end(int64_t n, const double *w, const int64_t *pred_ptr, const int32_t *pred, double *out) {
    for (int64_t i = 0; i < n; i++) {
        int64_t a = pred_ptr[i], b = pred_ptr[i + 1];
        double m;
        if (b - a == 2) {  /* x if x > y else y */
            double x = out[pred[a]], y = out[pred[a + 1]];
            m = x > y ? x : y;
        } else if (b > a) {  /* max(): the first of the greatest */
            m = out[pred[a]];
            for (int64_t j = a + 1; j < b; j++)
                if (out[pred[j]] > m) m = out[pred[j]];
        } else {
            m = 0.0;
        }
        out[i] = m + w[i];
    }
}

int tcsim_bottom_level(int64_t n, const double *w, const int64_t *pred_ptr, const int32_t *pred, double *out) {
    tcsim_t s;
    priv_t p;
    memset(&s, 0, sizeof(s));
    memset(&p, 0, sizeof(p));
    s.priv = &p;
    if (setjmp(p.jb)) {
        free(p.succ_ptr);
        free(p.succ);
        return s.err;
    }
    transpose(&s, n, pred_ptr, pred, &p.succ_ptr, &p.succ);
    for (int64_t i = n - 1; i >= 0; i--) {
        int64_t a = p.succ_ptr[i], b = p.succ_ptr[i + 1];
        double m = 0.0;
        if (b > a) {
            m = out[p.succ[a]];
            for (int64_t j = a + 1; j < b; j++)
                if (out[p.succ[j]] > m) m = out[p.succ[j]];
        }
        out[i] = m + w[i];
    }
    free(p.succ_ptr);
    free(p.succ);
    return TCSIM_OK;
}
