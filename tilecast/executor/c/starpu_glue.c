/* See starpu_glue.h. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <starpu.h>
#include <starpu_profiling.h>
#include <starpu_scheduler.h>
#include "starpu_glue.h"

typedef void (*kernel_fn)(const double *p, void *const *buf);

static int started, paused;
static int n_kernels;
static kernel_fn *fns;
static struct starpu_codelet *codelets, *dry_codelets;
static struct starpu_perfmodel *models;

/* The run in flight (one at a time). The task array is kept from one run to the next (no allocation
 * and page faults per step), and a slot's previous task is cleaned just before the slot is reused, in
 * the submission loop that overlaps the workers' execution, instead of after the last task. */
static struct {
    struct starpu_task *tasks;
    int64_t capacity; /* slots allocated */
    int64_t used;     /* slots [0, used) hold tasks still to clean */
    int active;       /* a run is submitted and not yet finished */
    int64_t submitted;
    int64_t done;
    volatile int abort;
    double t0_us;
    double submit_s;  /* the last submission loop's wall time */
    double last_cb_us, woken_us, paused_us, done_us; /* the run's marks after its last task (tcs_marks) */
    double *start, *end;
    int32_t *worker;
    pthread_mutex_t lock;
    pthread_cond_t cond;
} run = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

int tcs_policies(const char **names, const char **descs, int max)
{
    struct starpu_sched_policy **p = starpu_sched_get_predefined_policies();
    int n = 0;
    for (; p[n]; n++)
        if (n < max) {
            names[n] = p[n]->policy_name;
            descs[n] = p[n]->policy_description;
        }
    return n;
}

int tcs_max_cpus(void)
{
    return STARPU_MAXCPUS;
}

/* The configuration tilecast starts StarPU with, in one process and under StarPU-MPI alike (starpu_mpi_glue.c). */
void tcs_conf_init(struct starpu_conf *conf, const char *sched, int ncpus)
{
    starpu_conf_init(conf);
    conf->sched_policy_name = sched;
    conf->ncpus = ncpus;
    conf->ncuda = 0;
    conf->nopencl = 0;
    conf->nmic = 0;
    conf->nmpi_ms = 0;
    conf->precedence_over_environment_variables = 1;
    conf->catch_signals = 0;
}

/* init(conf) with SIGINT blocked: StarPU's threads inherit this thread's signal mask, so a Ctrl-C always
   reaches the main thread, where Python turns it into KeyboardInterrupt. */
int tcs_init_sigint_blocked(int (*init)(struct starpu_conf *), struct starpu_conf *conf)
{
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int ret = init(conf);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return ret;
}

int tcs_start(const char *sched, int ncpus)
{
    if (started)
        return -EBUSY;
    struct starpu_conf conf;
    tcs_conf_init(&conf, sched, ncpus);
    int ret = tcs_init_sigint_blocked(starpu_init, &conf);
    if (ret != 0)
        return ret;
    started = 1;
    starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    starpu_pause();
    paused = 1;
    return 0;
}

/* Pause the workers unless they are already: paused is set by the one thread that wins it (this one, or the
 * worker that ran a run's last callback), so that StarPU's pause depth is raised once. */
static int pause_once(void)
{
    int expected = 0;
    if (!__atomic_compare_exchange_n(&paused, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    starpu_pause();
    return 1;
}

void tcs_pause(void)
{
    if (started)
        pause_once();
}

void tcs_resume(void)
{
    if (started && paused) {
        starpu_resume();
        paused = 0;
    }
}

static void free_codelets(void)
{
    if (models)
        for (int k = 0; k < n_kernels; k++)
            free((char *)models[k].symbol);
    free(models);
    free(codelets);
    free(dry_codelets);
    free(fns);
    models = NULL;
    codelets = dry_codelets = NULL;
    fns = NULL;
    n_kernels = 0;
}

/* Clean every task still held and free the array (StarPU running: tasks must have terminated). */
static void release_tasks(void)
{
    if (run.used) {
        const int was_paused = paused;
        tcs_resume();
        starpu_task_wait_for_all();
        for (int64_t i = 0; i < run.used; i++)
            starpu_task_clean(&run.tasks[i]);
        if (was_paused)
            tcs_pause();
    }
    free(run.tasks);
    run.tasks = NULL;
    run.capacity = run.used = 0;
}

void tcs_stop(void)
{
    if (!started)
        return;
    tcs_resume(); /* shutting down paused workers would wait for them forever */
    starpu_task_wait_for_all();
    release_tasks();
    starpu_shutdown();
    started = 0;
    free_codelets();
}

int tcs_nworkers(void)
{
    return started ? (int)starpu_worker_get_count() : 0;
}

int tcs_worker_node(int worker)
{
    return (int)starpu_worker_get_memory_node(worker);
}

void tcs_priority_range(int *min_prio, int *max_prio)
{
    *min_prio = started ? starpu_sched_get_min_priority() : 0;
    *max_prio = started ? starpu_sched_get_max_priority() : 0;
}

int tcs_worker_name(int worker, char *out, int len)
{
    starpu_worker_get_name(worker, out, len);
    return 0;
}

/* The one CPU function of every codelet: find the kernel from the codelet and call it. */
static void cpu_func(void *buffers[], void *cl_arg)
{
    struct starpu_task *task = starpu_task_get_current();
    const int k = (int)(task->cl - codelets);
    const unsigned nb = STARPU_TASK_GET_NBUFFERS(task);
    void *ptrs[STARPU_NMAXBUFS];
    for (unsigned j = 0; j < nb; j++)
        ptrs[j] = (void *)STARPU_VECTOR_GET_PTR(buffers[j]);
    if (!run.abort)
        fns[k]((const double *)cl_arg, ptrs);
}

static void empty_func(void *buffers[], void *cl_arg)
{
    (void)buffers;
    (void)cl_arg;
}

int tcs_set_kernels(int n, const uint64_t *addrs, const char *const *names, const int *nbuffers)
{
    free_codelets();
    fns = calloc(n, sizeof *fns);
    codelets = calloc(n, sizeof *codelets);
    dry_codelets = calloc(n, sizeof *dry_codelets);
    models = calloc(n, sizeof *models);
    if (!fns || !codelets || !dry_codelets || !models)
        return -ENOMEM;
    n_kernels = n;
    for (int k = 0; k < n; k++) {
        if (nbuffers[k] > STARPU_NMAXBUFS)
            return -E2BIG;
        fns[k] = (kernel_fn)(uintptr_t)addrs[k];
        models[k].type = STARPU_HISTORY_BASED;
        models[k].symbol = strdup(names[k]);
        struct starpu_codelet *cl = &codelets[k];
        cl->where = STARPU_CPU;
        cl->cpu_funcs[0] = cpu_func;
        cl->nbuffers = STARPU_VARIABLE_NBUFFERS;
        cl->name = models[k].symbol;
        cl->model = &models[k];
        dry_codelets[k] = *cl;
        dry_codelets[k].cpu_funcs[0] = empty_func;
        dry_codelets[k].model = NULL;
    }
    return 0;
}

int tcs_register(int64_t n, const uint64_t *ptrs, const int64_t *nelem, const int64_t *elemsize, void **handles)
{
    for (int64_t i = 0; i < n; i++) {
        starpu_data_handle_t h = NULL;
        if (ptrs[i])
            starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptrs[i], (uint32_t)nelem[i],
                                        (size_t)elemsize[i]);
        handles[i] = h;
    }
    return 0;
}

void tcs_unregister(int64_t n, void **handles)
{
    for (int64_t i = 0; i < n; i++)
        if (handles[i]) {
            starpu_data_unregister((starpu_data_handle_t)handles[i]);
            handles[i] = NULL;
        }
}

int tcs_reregister_at(int64_t n_idx, const int64_t *idx, const uint64_t *ptrs, const int64_t *nelem,
                      const int64_t *elemsize, void **handles)
{
    for (int64_t k = 0; k < n_idx; k++) {
        const int64_t i = idx[k];
        if (handles[i])
            starpu_data_unregister((starpu_data_handle_t)handles[i]);
        starpu_data_handle_t h = NULL;
        if (ptrs[i])
            starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptrs[i], (uint32_t)nelem[i],
                                        (size_t)elemsize[i]);
        handles[i] = h;
    }
    return 0;
}

static double timespec_s(struct timespec *ts)
{
    return starpu_timing_timespec_to_us(ts) * 1e-6;
}

static void done_cb(void *arg)
{
    struct starpu_task *t = arg;
    const int64_t i = t - run.tasks;
    struct starpu_profiling_task_info *pi = t->profiling_info;
    if (pi && run.start) {
        run.start[i] = timespec_s(&pi->start_time) - run.t0_us * 1e-6;
        run.end[i] = timespec_s(&pi->end_time) - run.t0_us * 1e-6;
        run.worker[i] = pi->workerid;
    }
    /* Lock-free count; only the last task takes the lock to wake the waiting thread. */
    if (__atomic_add_fetch(&run.done, 1, __ATOMIC_ACQ_REL) >= __atomic_load_n(&run.submitted, __ATOMIC_ACQUIRE)) {
        run.last_cb_us = starpu_timing_now();
        /* Pause the workers here rather than in the waiting thread once it runs: this build's idle
         * workers spin (STARPU_NON_BLOCKING_DRIVERS), and on a machine with as many cores as workers the
         * thread just woken waited for one of them to be preempted (medians 2.5-5.7 ms on the 2-core VM
         * at load 9, docs/benchmarks.md). Paused, they block on StarPU's pause condition as soon as this task's
         * termination is done. Nothing is left to run; the next run resumes them. */
        pause_once();
        pthread_mutex_lock(&run.lock);
        pthread_cond_broadcast(&run.cond);
        pthread_mutex_unlock(&run.lock);
    }
}

static enum starpu_data_access_mode mode_of(int8_t m)
{
    return m == 3 ? STARPU_RW : m == 2 ? STARPU_W : STARPU_R;
}

int64_t tcs_submit(int64_t n_tasks, const int16_t *kernel, const int64_t *param_ptr, const double *params,
                   const int64_t *acc_ptr, const int32_t *acc_tile, const int8_t *acc_mode, void **handles,
                   const int32_t *priority, int flags, double *out_start, double *out_end, int32_t *out_worker, int *err)
{
    *err = 0;
    if (!started || run.active) {
        *err = -EBUSY;
        return 0;
    }
    if (n_tasks > run.capacity) {
        release_tasks();
        run.tasks = calloc(n_tasks, sizeof *run.tasks);
        if (!run.tasks) {
            *err = -ENOMEM;
            return 0;
        }
        run.capacity = n_tasks;
    }
    run.active = 1;
    struct starpu_codelet *cls = (flags & TCS_DRY) ? dry_codelets : codelets;
    run.start = out_start;
    run.end = out_end;
    run.worker = out_worker;
    run.abort = 0;
    run.done = 0;
    /* Count every task as submitted up front so that early completions never see done == submitted. */
    run.submitted = n_tasks;
    run.last_cb_us = run.woken_us = run.paused_us = run.done_us = 0.0;
    /* The workers are resumed once the graph's first tasks are queued, not before the first one: woken
     * (they spin, STARPU_NON_BLOCKING_DRIVERS) with nothing to run, they took the cores from this thread
     * before it submitted anything (2-15 ms at the 90th percentile on the loaded 2-core VM). */
    const int64_t resume_at = (flags & TCS_SUBMIT_PAUSED) ? -1 : 2 * (int64_t)starpu_worker_get_count();
    int resumed = 0;
    run.t0_us = starpu_timing_now();
    int64_t i = 0;
    for (; i < n_tasks; i++) {
        if (i == resume_at) {
            tcs_resume();
            resumed = 1;
        }
        struct starpu_task *t = &run.tasks[i];
        if (i < run.used)
            starpu_task_clean(t);
        starpu_task_init(t);
        t->cl = &cls[kernel[i]];
        t->cl_arg = (void *)(params + param_ptr[i]);
        t->cl_arg_size = (size_t)(param_ptr[i + 1] - param_ptr[i]) * sizeof(double);
        const int64_t a = acc_ptr[i], nb = acc_ptr[i + 1] - a;
        t->nbuffers = (int)nb;
        for (int64_t j = 0; j < nb; j++) {
            t->handles[j] = (starpu_data_handle_t)handles[acc_tile[a + j]];
            t->modes[j] = mode_of(acc_mode[a + j]);
        }
        if (priority)
            t->priority = priority[i];
        t->callback_func = done_cb;
        t->callback_arg = t;
        t->destroy = 0;
        t->detach = 1;
        int ret = starpu_task_submit(t);
        if (ret != 0) {
            *err = ret;
            break;
        }
    }
    run.submit_s = (starpu_timing_now() - run.t0_us) * 1e-6;
    /* Policies that wait for the whole graph (graph_test) start scheduling here. */
    starpu_do_schedule();
    if (!resumed) /* else the last task's callback may have paused them since */
        tcs_resume();
    const int64_t filled = i < n_tasks ? i + 1 : i; /* a refused task was initialised too */
    for (int64_t k = filled; k < run.used; k++) /* slots the previous, larger run left */
        starpu_task_clean(&run.tasks[k]);
    run.used = filled;
    if (i < n_tasks) {
        pthread_mutex_lock(&run.lock);
        __atomic_store_n(&run.submitted, i, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&run.cond);
        pthread_mutex_unlock(&run.lock);
    }
    return i;
}

int64_t tcs_wait(int timeout_ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec += 1;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&run.lock);
    while (__atomic_load_n(&run.done, __ATOMIC_ACQUIRE) < __atomic_load_n(&run.submitted, __ATOMIC_ACQUIRE))
        if (pthread_cond_timedwait(&run.cond, &run.lock, &dl) == ETIMEDOUT)
            break;
    int64_t done = __atomic_load_n(&run.done, __ATOMIC_ACQUIRE);
    pthread_mutex_unlock(&run.lock);
    if (done >= __atomic_load_n(&run.submitted, __ATOMIC_ACQUIRE) && run.woken_us == 0.0)
        run.woken_us = starpu_timing_now();
    return done;
}

void tcs_abort(void)
{
    run.abort = 1;
}

double tcs_submit_seconds(void)
{
    return run.submit_s;
}

void tcs_marks(double *out)
{
    /* StarPU's clock is CLOCK_MONOTONIC less its value at starpu_init: put that back */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double offset = (double)ts.tv_sec + ts.tv_nsec * 1e-9 - starpu_timing_now() * 1e-6;
    const double us[6] = {run.t0_us, run.t0_us + run.submit_s * 1e6, run.last_cb_us, run.woken_us,
                          run.paused_us, run.done_us};
    for (int k = 0; k < 6; k++)
        out[k] = us[k] * 1e-6 + offset;
}

double tcs_finish(void)
{
    if (!run.active)
        return 0.0;
    while (tcs_wait(1000) < run.submitted)
        ;
    /* The last task's callback paused the workers (else, after an error, pause them here): idle
     * workers block instead of spinning; then wait for that task's termination, which the pause does
     * not hold up (a worker finishes a job before it looks at the pause). */
    tcs_pause();
    run.paused_us = starpu_timing_now();
    starpu_task_wait_for_all();
    run.done_us = starpu_timing_now();
    const double wall = (run.done_us - run.t0_us) * 1e-6;
    run.active = 0;
    run.start = run.end = NULL;
    run.worker = NULL;
    run.submitted = run.done = 0;
    return wall;
}

static struct starpu_codelet baseline_cl = {
    .where = STARPU_CPU,
    .cpu_funcs = {empty_func},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "empty",
};

double tcs_baseline(int64_t n_tasks, const int64_t *acc_ptr, const int32_t *acc_tile, const int8_t *acc_mode,
                    void **handles, int profiling)
{
    if (!started || run.active)
        return -1.0;
    const int prof = starpu_profiling_status_get();
    starpu_profiling_status_set(profiling ? STARPU_PROFILING_ENABLE : STARPU_PROFILING_DISABLE);
    tcs_resume();
    const double t0 = starpu_timing_now();
    for (int64_t i = 0; i < n_tasks; i++) {
        struct starpu_task *t = starpu_task_create();
        t->cl = &baseline_cl;
        const int64_t a = acc_ptr[i], nb = acc_ptr[i + 1] - a;
        t->nbuffers = (int)nb;
        for (int64_t j = 0; j < nb; j++) {
            t->handles[j] = (starpu_data_handle_t)handles[acc_tile[a + j]];
            t->modes[j] = mode_of(acc_mode[a + j]);
        }
        if (starpu_task_submit(t) != 0) {
            starpu_task_destroy(t);
            break;
        }
    }
    starpu_do_schedule();
    starpu_task_wait_for_all();
    const double wall = (starpu_timing_now() - t0) * 1e-6;
    tcs_pause();
    starpu_profiling_status_set(prof);
    return wall;
}

/* Kernel k's codelet, for the StarPU-MPI glue (starpu_mpi_glue.c) linked into the same extension. */
struct starpu_codelet *tcs_codelet(int k)
{
    return k >= 0 && k < n_kernels ? &codelets[k] : NULL;
}

/* --- StarPU-managed tiles and the disk node (see starpu_glue.h) ------------------------------------ */

int tcs_register_managed(int64_t n, const int64_t *nelem, const int64_t *elemsize, void **handles)
{
    for (int64_t i = 0; i < n; i++) {
        starpu_data_handle_t h = NULL;
        if (nelem[i] > 0)
            starpu_vector_data_register(&h, -1, 0, (uint32_t)nelem[i], (size_t)elemsize[i]);
        handles[i] = h;
    }
    return 0;
}

void tcs_unregister_managed(int64_t n, void **handles)
{
    /* A tile on its way to or from the disk node is unregistered only once that transfer is done, and the
     * workers drive the disk node: they must not be paused (seen hanging here otherwise). */
    const int was_paused = paused;
    tcs_resume();
    for (int64_t i = 0; i < n; i++)
        if (handles[i]) {
            starpu_data_unregister_no_coherency((starpu_data_handle_t)handles[i]);
            handles[i] = NULL;
        }
    if (was_paused)
        tcs_pause();
}

static int copy_tiles(int64_t n, const int64_t *idx, const uint64_t *host, void **handles, int to_tile)
{
    /* Fetches from the disk node are done by the workers' progress: they must not be paused. */
    const int was_paused = paused;
    tcs_resume();
    int err = 0;
    for (int64_t k = 0; k < n && !err; k++) {
        starpu_data_handle_t h = (starpu_data_handle_t)handles[idx[k]];
        if (!h)
            continue;
        err = starpu_data_acquire_on_node(h, STARPU_MAIN_RAM, to_tile ? STARPU_W : STARPU_R);
        if (err)
            break;
        void *tile = (void *)starpu_data_handle_to_pointer(h, STARPU_MAIN_RAM);
        const size_t bytes = starpu_data_get_size(h);
        if (to_tile)
            memcpy(tile, (const void *)(uintptr_t)host[k], bytes);
        else
            memcpy((void *)(uintptr_t)host[k], tile, bytes);
        starpu_data_release_on_node(h, STARPU_MAIN_RAM);
    }
    if (was_paused)
        tcs_pause();
    return err;
}

int tcs_tiles_write(int64_t n, const int64_t *idx, const uint64_t *src, void **handles)
{
    return copy_tiles(n, idx, src, handles, 1);
}

int tcs_tiles_read(int64_t n, const int64_t *idx, const uint64_t *dst, void **handles)
{
    return copy_tiles(n, idx, dst, handles, 0);
}

const struct starpu_disk_ops *tcs_direct_disk_ops(void); /* c/disk_ops.c */

int tcs_disk_register(const char *dir, int64_t size, int direct)
{
    if (!started)
        return -1;
    struct starpu_disk_ops *ops = direct ? (struct starpu_disk_ops *)tcs_direct_disk_ops() : &starpu_disk_unistd_ops;
    return starpu_disk_register(ops, (void *)dir, (starpu_ssize_t)size);
}

int tcs_bus_bytes(int src, int dst, int64_t *bytes, int64_t *count)
{
    *bytes = *count = 0;
    const int bus = starpu_bus_get_id(src, dst);
    if (bus < 0)
        return -1;
    struct starpu_profiling_bus_info info;
    const int ret = starpu_bus_get_profiling_info(bus, &info);
    if (ret == 0) {
        *bytes = info.transferred_bytes;
        *count = info.transfer_count;
    }
    return ret;
}
