/* Submit a task graph exported by tilecast (tilecast/executor/simgrid_replay.py) to StarPU and print its
 * makespan. Linked against StarPU built with SimGrid, StarPU runs no kernel: each task lasts what its
 * codelet's history-based performance model (named after the kernel, as in starpu_glue.c) holds for its
 * footprint, in SimGrid's virtual time, on the platform StarPU's bus calibration described.
 *
 * The tasks are the glue's: one codelet per kernel with a STARPU_HISTORY_BASED model of the kernel's
 * name, every tile a vector handle in main memory of the same element count and size as the real run
 * registers (so footprints, hence history entries, are the same), the same access modes, submission
 * order and priorities, and the same policy and CPU worker count.
 *
 * Usage: simgrid_replay GRAPH SCHED NCPUS [STEPS]
 * Output: "workers N", then per step "makespan_s SECONDS" (first submission to the last task's end,
 * virtual time) followed by one line per worker, "worker W tasks N busy_s SECONDS" (the tasks it ran and the
 * sum of their execution times, from StarPU's task profiling). Built with -DTCS_PARSE_ONLY (no StarPU), it only reads GRAPH and prints its summary.
 *
 * GRAPH: a text header, then little-endian binary arrays:
 *   tilecast-graph 1
 *   kernels K          followed by K lines: name nbuffers
 *   tiles T tasks N accesses A priorities P
 *   data
 *   int64 nelem[T], int64 elemsize[T], int16 kernel[N], int32 priority[N if P else 0],
 *   int64 acc_ptr[N+1], int32 acc_tile[A], int8 acc_mode[A] (1 R, 2 W, 3 RW)
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef TCS_PARSE_ONLY
#include <sys/mman.h>
#include <starpu.h>
#include <starpu_profiling.h>
#endif

#define MAX_NAME 128

struct graph {
    int n_kernels;
    char (*names)[MAX_NAME];
    int64_t n_tiles, n_tasks, n_acc;
    int has_prio;
    int64_t *nelem, *elemsize, *acc_ptr;
    int16_t *kernel;
    int32_t *prio, *acc_tile;
    int8_t *acc_mode;
};

static void die(const char *what, const char *path)
{
    fprintf(stderr, "simgrid_replay: %s: %s\n", path, what);
    exit(2);
}

static void *read_array(FILE *f, size_t n, size_t size, const char *path)
{
    void *p = malloc(n * size + 1);
    if (!p)
        die("out of memory", path);
    if (n && fread(p, size, n, f) != n)
        die("truncated graph file", path);
    return p;
}

static void read_graph(const char *path, struct graph *g)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die(strerror(errno), path);
    int version = 0;
    if (fscanf(f, "tilecast-graph %d kernels %d", &version, &g->n_kernels) != 2 || version != 1)
        die("not a tilecast graph export (version 1)", path);
    if (g->n_kernels <= 0 || g->n_kernels > 32767)
        die("bad kernel count", path);
    g->names = calloc(g->n_kernels, sizeof *g->names);
    for (int k = 0; k < g->n_kernels; k++) {
        int nb;
        if (fscanf(f, "%127s %d", g->names[k], &nb) != 2)
            die("bad kernel line", path);
    }
    long long t, n, a;
    if (fscanf(f, " tiles %lld tasks %lld accesses %lld priorities %d", &t, &n, &a, &g->has_prio) != 4)
        die("bad counts line", path);
    char word[8];
    if (fscanf(f, "%7s", word) != 1 || strcmp(word, "data") != 0 || fgetc(f) != '\n')
        die("missing data line", path);
    g->n_tiles = t, g->n_tasks = n, g->n_acc = a;
    g->nelem = read_array(f, t, 8, path);
    g->elemsize = read_array(f, t, 8, path);
    g->kernel = read_array(f, n, 2, path);
    g->prio = g->has_prio ? read_array(f, n, 4, path) : NULL;
    g->acc_ptr = read_array(f, n + 1, 8, path);
    g->acc_tile = read_array(f, a, 4, path);
    g->acc_mode = read_array(f, a, 1, path);
    if (fgetc(f) != EOF)
        die("trailing bytes after the arrays", path);
    fclose(f);
    /* Check what the submission relies on. */
    if (g->acc_ptr[0] != 0 || g->acc_ptr[n] != a)
        die("access offsets do not cover the accesses", path);
    for (int64_t i = 0; i < n; i++) {
        if (g->kernel[i] < 0 || g->kernel[i] >= g->n_kernels)
            die("task with an unknown kernel", path);
        if (g->acc_ptr[i + 1] < g->acc_ptr[i])
            die("decreasing access offsets", path);
    }
    for (int64_t j = 0; j < a; j++)
        if (g->acc_tile[j] < 0 || g->acc_tile[j] >= t || g->acc_mode[j] < 1 || g->acc_mode[j] > 3)
            die("access to an unknown tile or with an unknown mode", path);
}

#ifdef TCS_PARSE_ONLY
/* What the export holds, for tests: counts, bytes touched per kernel, access and priority checksums. */
int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s GRAPH\n", argv[0]);
        return 2;
    }
    struct graph g;
    read_graph(argv[1], &g);
    printf("kernels %d tiles %lld tasks %lld accesses %lld priorities %d\n", g.n_kernels, (long long)g.n_tiles,
           (long long)g.n_tasks, (long long)g.n_acc, g.has_prio);
    int64_t *count = calloc(g.n_kernels, 8), *bytes = calloc(g.n_kernels, 8);
    int64_t modes = 0, prio = 0;
    for (int64_t i = 0; i < g.n_tasks; i++) {
        const int k = g.kernel[i];
        count[k]++;
        for (int64_t j = g.acc_ptr[i]; j < g.acc_ptr[i + 1]; j++) {
            bytes[k] += g.nelem[g.acc_tile[j]] * g.elemsize[g.acc_tile[j]];
            modes += (j + 1) * g.acc_mode[j] + g.acc_tile[j];
        }
        if (g.prio)
            prio += (i + 1) * (int64_t)g.prio[i];
    }
    for (int k = 0; k < g.n_kernels; k++)
        if (count[k])
            printf("kernel %s tasks %lld bytes %lld\n", g.names[k], (long long)count[k], (long long)bytes[k]);
    printf("checksum %lld %lld\n", (long long)modes, (long long)prio);
    return 0;
}
#else

#define MAX_WORKERS 256

static int64_t done, total;
static double t0_us, last_end_us;
static int64_t worker_tasks[MAX_WORKERS];
static double worker_busy_us[MAX_WORKERS];

static void cpu_func(void *buffers[], void *cl_arg)
{
    (void)buffers;
    (void)cl_arg;
}

static void done_cb(void *arg)
{
    (void)arg;
    const double now = starpu_timing_now();
    if (now > last_end_us)
        last_end_us = now;
    done++;
    const int w = starpu_worker_get_id();
    struct starpu_task *t = starpu_task_get_current();
    if (w >= 0 && w < MAX_WORKERS) {
        worker_tasks[w]++;
        if (t && t->profiling_info)
            worker_busy_us[w] += starpu_timing_timespec_to_us(&t->profiling_info->end_time)
                                 - starpu_timing_timespec_to_us(&t->profiling_info->start_time);
    }
}

static enum starpu_data_access_mode mode_of(int8_t m)
{
    return m == 3 ? STARPU_RW : m == 2 ? STARPU_W : STARPU_R;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s GRAPH SCHED NCPUS [STEPS]\n", argv[0]);
        return 2;
    }
    struct graph g;
    read_graph(argv[1], &g);
    const int steps = argc == 5 ? atoi(argv[4]) : 1;

    struct starpu_conf conf;
    starpu_conf_init(&conf);
    conf.sched_policy_name = argv[2];
    conf.ncpus = atoi(argv[3]);
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.precedence_over_environment_variables = 1;
    int ret = starpu_init(&conf);
    if (ret != 0) {
        fprintf(stderr, "simgrid_replay: starpu_init failed (%d)\n", ret);
        return 1;
    }
    starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    printf("workers %u\n", starpu_worker_get_count());

    struct starpu_perfmodel *models = calloc(g.n_kernels, sizeof *models);
    struct starpu_codelet *cls = calloc(g.n_kernels, sizeof *cls);
    for (int k = 0; k < g.n_kernels; k++) {
        models[k].type = STARPU_HISTORY_BASED;
        models[k].symbol = g.names[k];
        cls[k].where = STARPU_CPU;
        cls[k].cpu_funcs[0] = cpu_func;
        cls[k].nbuffers = STARPU_VARIABLE_NBUFFERS;
        cls[k].name = g.names[k];
        cls[k].model = &models[k];
    }

    /* Tiles in main memory, at distinct addresses: one reservation that no kernel ever touches. */
    size_t span = 0;
    for (int64_t i = 0; i < g.n_tiles; i++)
        span += ((size_t)(g.nelem[i] * g.elemsize[i]) + 63) & ~(size_t)63;
    char *base = mmap(NULL, span ? span : 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (base == MAP_FAILED) {
        fprintf(stderr, "simgrid_replay: cannot reserve %zu bytes for the tiles\n", span);
        return 1;
    }
    starpu_data_handle_t *handles = calloc(g.n_tiles + 1, sizeof *handles);
    size_t off = 0;
    for (int64_t i = 0; i < g.n_tiles; i++) {
        const size_t nb = (size_t)(g.nelem[i] * g.elemsize[i]);
        if (nb)
            starpu_vector_data_register(&handles[i], STARPU_MAIN_RAM, (uintptr_t)(base + off), (uint32_t)g.nelem[i],
                                        (size_t)g.elemsize[i]);
        off += (nb + 63) & ~(size_t)63;
    }

    for (int s = 0; s < steps; s++) {
        done = 0;
        total = g.n_tasks;
        memset(worker_tasks, 0, sizeof worker_tasks);
        memset(worker_busy_us, 0, sizeof worker_busy_us);
        t0_us = starpu_timing_now();
        last_end_us = t0_us;
        for (int64_t i = 0; i < g.n_tasks; i++) {
            struct starpu_task *t = starpu_task_create();
            t->cl = &cls[g.kernel[i]];
            const int64_t a = g.acc_ptr[i], nb = g.acc_ptr[i + 1] - a;
            t->nbuffers = (int)nb;
            if (nb > STARPU_NMAXBUFS) {
                fprintf(stderr, "simgrid_replay: task %lld has %lld buffers (StarPU's limit: %d)\n", (long long)i,
                        (long long)nb, STARPU_NMAXBUFS);
                return 1;
            }
            for (int64_t j = 0; j < nb; j++) {
                t->handles[j] = handles[g.acc_tile[a + j]];
                t->modes[j] = mode_of(g.acc_mode[a + j]);
            }
            if (g.prio)
                t->priority = g.prio[i];
            t->callback_func = done_cb;
            ret = starpu_task_submit(t);
            if (ret != 0) {
                fprintf(stderr, "simgrid_replay: task %lld refused (%d)\n", (long long)i, ret);
                return 1;
            }
        }
        starpu_do_schedule();
        starpu_task_wait_for_all();
        printf("makespan_s %.9f\n", (last_end_us - t0_us) * 1e-6);
        const unsigned nw = starpu_worker_get_count();
        for (unsigned w = 0; w < nw && w < MAX_WORKERS; w++)
            printf("worker %u tasks %lld busy_s %.9f\n", w, (long long)worker_tasks[w], worker_busy_us[w] * 1e-6);
        fflush(stdout);
    }
    for (int64_t i = 0; i < g.n_tiles; i++)
        if (handles[i])
            starpu_data_unregister(handles[i]);
    starpu_shutdown();
    return 0;
}
#endif
