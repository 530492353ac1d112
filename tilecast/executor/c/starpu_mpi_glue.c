/* See starpu_mpi_glue.h. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
#include <starpu.h>
#include <starpu_mpi.h>
#include <starpu_profiling.h>
#include "starpu_mpi_glue.h"

/* starpu_glue.c */
struct starpu_codelet *tcs_codelet(int k);
void tcs_conf_init(struct starpu_conf *conf, const char *sched, int ncpus);
int tcs_init_sigint_blocked(int (*init)(struct starpu_conf *), struct starpu_conf *conf);

static int started;
static double *rec_start, *rec_end;
static int32_t *rec_worker;
static double *rec_submit; /* tcsm_record_submit: when each starpu_mpi_task_insert returned */
static int64_t executed;

static int mpi_by_us; /* MPI was initialised here (tcsm_pingpong raw) before StarPU-MPI started */

/* With STARPU_MPI_DRIVER_CALL_FREQUENCY > 0 StarPU-MPI's progress thread runs CPU worker 0 itself
 * (_starpu_mpi_driver_init, mpi/src/mpi/starpu_mpi_mpi.c): one thread polls MPI and runs that worker's tasks.
 * But _starpu_mpi_progress_thread_func calls starpu_driver_run_once only while a receive waits for its
 * envelope, and sleeps on progress_cond once no request is pending: a rank whose tasks come after its last
 * receive would never run them. A receive from this rank to itself, posted before the step's tasks and
 * matched by a send once they are all done, keeps the thread in its polling loop for the whole step. */
static int drives_worker;            /* the progress thread runs worker 0 */
static int keeping;                  /* the keep-alive receive is posted */
static starpu_data_handle_t keep_h[2];
static int keep_val[2];
static size_t keep_bytes;            /* bytes of the keep-alive sends, taken out of tcsm_comm_amounts */
#define KEEP_TAG ((starpu_mpi_tag_t)1 << 40) /* above every tile id */

static int mpi_init(struct starpu_conf *conf)
{
    int already = 0;
    MPI_Initialized(&already);
    return starpu_mpi_init_conf(NULL, NULL, !already, MPI_COMM_WORLD, conf);
}

int tcsm_start(const char *sched, int ncpus)
{
    if (started)
        return -EBUSY;
    struct starpu_conf conf;
    tcs_conf_init(&conf, sched, ncpus);
    int ret = tcs_init_sigint_blocked(mpi_init, &conf);
    if (ret != 0)
        return ret;
    started = 1;
    drives_worker = starpu_get_env_number_default("STARPU_MPI_DRIVER_CALL_FREQUENCY", 0) > 0;
    starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    return 0;
}

int tcsm_progress_drives_worker(void)
{
    return started && drives_worker;
}

static int keep_polling_begin(void)
{
    if (!drives_worker || keeping)
        return 0;
    if (!keep_h[0])
        for (int i = 0; i < 2; i++)
            starpu_vector_data_register(&keep_h[i], STARPU_MAIN_RAM, (uintptr_t)&keep_val[i], 1, sizeof(int));
    int ret = starpu_mpi_irecv_detached(keep_h[0], tcsm_rank(), KEEP_TAG, MPI_COMM_WORLD, NULL, NULL);
    keeping = ret == 0;
    return ret;
}

static void keep_polling_end(void)
{
    if (!keeping)
        return;
    starpu_task_wait_for_all(); /* run by the progress thread while the receive is posted */
    starpu_mpi_isend_detached(keep_h[1], tcsm_rank(), KEEP_TAG, MPI_COMM_WORLD, NULL, NULL);
    keep_bytes += sizeof(int);
    keeping = 0;
}

void tcsm_stop(void)
{
    if (!started)
        return;
    keep_polling_end();
    starpu_mpi_wait_for_all(MPI_COMM_WORLD);
    for (int i = 0; i < 2; i++)
        if (keep_h[i]) {
            starpu_data_unregister(keep_h[i]);
            keep_h[i] = NULL;
        }
    starpu_mpi_shutdown(); /* shuts StarPU down too, since starpu_mpi_init_conf started it */
    started = 0;
    if (mpi_by_us) {
        MPI_Finalize();
        mpi_by_us = 0;
    }
}

int tcsm_rank(void)
{
    int r = -1;
    starpu_mpi_comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int tcsm_size(void)
{
    int n = 0;
    starpu_mpi_comm_size(MPI_COMM_WORLD, &n);
    return n;
}

int tcsm_register(int64_t n, const uint64_t *ptrs, const int64_t *nelem, const int64_t *elemsize,
                  const int32_t *owner, void **handles)
{
    const int me = tcsm_rank();
    for (int64_t i = 0; i < n; i++) {
        starpu_data_handle_t h = NULL;
        if (owner[i] == me)
            starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)ptrs[i], (uint32_t)nelem[i],
                                        (size_t)elemsize[i]);
        else
            starpu_vector_data_register(&h, -1, 0, (uint32_t)nelem[i], (size_t)elemsize[i]);
        starpu_mpi_data_register(h, (starpu_mpi_tag_t)i, owner[i]);
        handles[i] = h;
    }
    return 0;
}

void tcsm_unregister(int64_t n, void **handles)
{
    for (int64_t i = 0; i < n; i++)
        if (handles[i]) {
            starpu_data_unregister((starpu_data_handle_t)handles[i]);
            handles[i] = NULL;
        }
}

static void done_cb(void *arg)
{
    const int64_t i = (int64_t)(intptr_t)arg;
    struct starpu_task *t = starpu_task_get_current();
    struct starpu_profiling_task_info *pi = t ? t->profiling_info : NULL;
    if (pi && rec_start) {
        rec_start[i] = starpu_timing_timespec_to_us(&pi->start_time);
        rec_end[i] = starpu_timing_timespec_to_us(&pi->end_time);
        rec_worker[i] = pi->workerid;
    }
    __atomic_add_fetch(&executed, 1, __ATOMIC_RELAXED);
}

static enum starpu_data_access_mode mode_of(int8_t m)
{
    return m == 3 ? STARPU_RW : m == 2 ? STARPU_W : STARPU_R;
}

int64_t tcsm_submit(int64_t n_tasks, const int16_t *kernel, const int64_t *param_ptr, const double *params,
                    const int64_t *acc_ptr, const int32_t *acc_tile, const int8_t *acc_mode, void **handles,
                    const int32_t *priority, double *out_start, double *out_end, int32_t *out_worker, int *err)
{
    *err = 0;
    if (!started) {
        *err = -EINVAL;
        return 0;
    }
    rec_start = out_start;
    rec_end = out_end;
    rec_worker = out_worker;
    int kret = keep_polling_begin();
    if (kret != 0) {
        *err = kret;
        return 0;
    }
    struct starpu_data_descr descr[STARPU_NMAXBUFS];
    double *at = rec_submit;
    if (at)
        at[0] = starpu_timing_now();
    int64_t i = 0;
    for (; i < n_tasks; i++) {
        const int64_t a = acc_ptr[i], nb = acc_ptr[i + 1] - a;
        if (nb > STARPU_NMAXBUFS) {
            *err = -E2BIG;
            break;
        }
        for (int64_t j = 0; j < nb; j++) {
            descr[j].handle = (starpu_data_handle_t)handles[acc_tile[a + j]];
            descr[j].mode = mode_of(acc_mode[a + j]);
        }
        /* The parameters stay in the caller's array until the step ends: not copied, not freed. */
        int ret = starpu_mpi_task_insert(MPI_COMM_WORLD, tcs_codelet(kernel[i]),
                                         STARPU_DATA_MODE_ARRAY, descr, (int)nb,
                                         STARPU_CL_ARGS_NFREE, (void *)(params + param_ptr[i]),
                                         (size_t)(param_ptr[i + 1] - param_ptr[i]) * sizeof(double),
                                         STARPU_PRIORITY, priority ? (int)priority[i] : 0,
                                         STARPU_CALLBACK_WITH_ARG_NFREE, done_cb, (void *)(intptr_t)i,
                                         0);
        if (ret != 0) {
            *err = ret;
            break;
        }
        if (at)
            at[i + 1] = starpu_timing_now();
    }
    return i;
}

void tcsm_record_submit(double *out)
{
    rec_submit = out;
}

double tcsm_wait_all(void)
{
    keep_polling_end();
    starpu_mpi_wait_for_all(MPI_COMM_WORLD);
    return starpu_timing_now();
}

double tcsm_barrier(void)
{
    starpu_mpi_barrier(MPI_COMM_WORLD);
    return starpu_timing_now();
}

double tcsm_clock_offset_us(void)
{
    /* starpu_timing_now is CLOCK_MONOTONIC less the time of starpu_init (src/common/timing.c,
       _starpu_clock_gettime): the offset is one constant per process, read here between two monotonic reads. */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    const double now = starpu_timing_now();
    clock_gettime(CLOCK_MONOTONIC, &b);
    const double mono = 0.5 * ((double)a.tv_sec * 1e6 + a.tv_nsec * 1e-3 + (double)b.tv_sec * 1e6 + b.tv_nsec * 1e-3);
    return mono - now;
}

void tcsm_flush_cache(void)
{
    starpu_mpi_cache_flush_all_data(MPI_COMM_WORLD);
}

void tcsm_comm_amounts(size_t *out)
{
    starpu_mpi_comm_amounts_retrieve(out);
    const int me = tcsm_rank();
    if (me >= 0)
        out[me] -= out[me] >= keep_bytes ? keep_bytes : out[me]; /* the keep-alive sends to this rank itself */
}

void tcsm_priority_range(int *lo, int *hi)
{
    *lo = started ? starpu_sched_get_min_priority() : 0;
    *hi = started ? starpu_sched_get_max_priority() : 0;
}

int64_t tcsm_executed(void)
{
    return __atomic_load_n(&executed, __ATOMIC_RELAXED);
}

/* One round trip of rank 0 with rank 1 (rank 0 sends first), through StarPU-MPI or plain MPI. */
static int round_trip(int raw, int me, void *buf, int64_t nbytes, starpu_data_handle_t h, int64_t tag)
{
    const int peer = 1 - me;
    MPI_Status st;
    for (int step = 0; step < 2; step++) {
        const int sending = (step == 0) == (me == 0);
        int ret;
        if (raw)
            ret = sending ? MPI_Send(buf, (int)nbytes, MPI_BYTE, peer, (int)tag, MPI_COMM_WORLD)
                          : MPI_Recv(buf, (int)nbytes, MPI_BYTE, peer, (int)tag, MPI_COMM_WORLD, &st);
        else
            ret = sending ? starpu_mpi_send(h, peer, (starpu_mpi_tag_t)tag, MPI_COMM_WORLD)
                          : starpu_mpi_recv(h, peer, (starpu_mpi_tag_t)tag, MPI_COMM_WORLD, &st);
        if (ret != 0)
            return ret;
    }
    return 0;
}

int tcsm_pingpong(int raw, int64_t nsizes, const int64_t *nbytes, int reps, double *out_s)
{
    if (raw && !started) {
        int init = 0, provided = 0;
        MPI_Initialized(&init);
        if (!init) {
            if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
                return -EIO;
            mpi_by_us = 1;
        }
    } else if (raw || !started) {
        return -EINVAL; /* plain MPI only before StarPU-MPI owns it; StarPU-MPI only once started */
    }
    int me = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2)
        return -EINVAL;
    int64_t most = 8;
    for (int64_t i = 0; i < nsizes; i++)
        most = nbytes[i] > most ? nbytes[i] : most;
    char *buf = calloc((size_t)most, 1);
    if (!buf)
        return -ENOMEM;
    int ret = 0;
    const int warmup = 10;
    for (int64_t i = 0; i < nsizes && ret == 0; i++) {
        const int64_t n = nbytes[i] > 8 ? nbytes[i] : 8;
        if (raw) /* every rank is here (a rank still starting up would be timed otherwise) */
            MPI_Barrier(MPI_COMM_WORLD);
        else
            starpu_mpi_barrier(MPI_COMM_WORLD);
        starpu_data_handle_t h = NULL;
        if (me < 2 && !raw)
            starpu_vector_data_register(&h, STARPU_MAIN_RAM, (uintptr_t)buf, (uint32_t)n, 1);
        for (int r = -warmup; r < reps && ret == 0 && me < 2; r++) {
            const double t0 = MPI_Wtime();
            ret = round_trip(raw, me, buf, n, h, (int64_t)30000 + i); /* MPI guarantees tags up to 32767 */
            if (r >= 0 && me == 0)
                out_s[i * reps + r] = MPI_Wtime() - t0;
        }
        if (h)
            starpu_data_unregister(h);
    }
    free(buf);
    if (raw)
        MPI_Barrier(MPI_COMM_WORLD);
    else
        starpu_mpi_barrier(MPI_COMM_WORLD);
    return ret;
}
