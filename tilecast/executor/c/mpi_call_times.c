/* When each MPI call of a rank began and ended: a PMPI interposer, loaded with LD_PRELOAD into the ranks of
 * one `run --ranks` (tilecast/executor/mpi_call_times.py), to measure what StarPU-MPI's progress thread spends
 * per message. Debian's StarPU 1.3.10 is built without FxT, so StarPU itself records no request's times.
 *
 * Every call of the kinds below is kept in a ring (the last TC_CALLS records) with CLOCK_MONOTONIC times, the
 * calling thread, the bytes, the request handle (so a completing MPI_Test names the send or receive it ends),
 * the completion flag, and for a post the other rank and the tag. MPI_Finalize writes the ring to
 * $TILECAST_MPI_CALLS_DIR/calls-<rank>.bin: an int64 count, a double (what recording one call costs, us, timed
 * there), then the records, oldest first. */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { OP_ISEND = 1, OP_ISSEND = 2, OP_IRECV = 3, OP_TEST = 4, OP_IPROBE = 5, OP_WAIT = 6, OP_BARRIER = 7 };

typedef struct {
    double t_us;     /* CLOCK_MONOTONIC at the call's start */
    float dur_us;
    int32_t tid;
    int32_t bytes;
    int16_t op;
    int16_t flag;    /* MPI_Test, MPI_Iprobe: the request completed / a message is there */
    int64_t request; /* the handle: returned by MPI_Isend/Irecv, passed to MPI_Test/Wait */
    int32_t peer;    /* MPI_Isend/Irecv: the other rank (MPI_ANY_SOURCE as MPI gives it); else -1 */
    int32_t tag;     /* MPI_Isend/Irecv: the MPI tag; else 0 */
} tc_call;

#define TC_CALLS (1L << 20)
static tc_call *ring;
static long next;
static __thread int32_t tid;

static double now_us(void)
{
    struct timespec a;
    clock_gettime(CLOCK_MONOTONIC, &a);
    return a.tv_sec * 1e6 + a.tv_nsec * 1e-3;
}

static void keep_msg(double t, int op, int flag, int bytes, MPI_Request req, int peer, int tag)
{
    double end = now_us();
    if (!ring)
        return;
    if (!tid)
        tid = (int32_t)syscall(SYS_gettid);
    tc_call *c = &ring[__atomic_fetch_add(&next, 1, __ATOMIC_RELAXED) & (TC_CALLS - 1)];
    c->t_us = t;
    c->dur_us = (float)(end - t);
    c->tid = tid;
    c->bytes = bytes;
    c->op = (int16_t)op;
    c->flag = (int16_t)flag;
    c->request = (int64_t)(intptr_t)req;
    c->peer = peer;
    c->tag = tag;
}

static void keep(double t, int op, int flag, int bytes, MPI_Request req)
{
    keep_msg(t, op, flag, bytes, req, -1, 0);
}

static int nbytes(int count, MPI_Datatype type)
{
    int size = 0;
    PMPI_Type_size(type, &size);
    return count * size;
}

static void start(void)
{
    if (!ring) {
        ring = malloc(TC_CALLS * sizeof(tc_call));
        if (ring)
            memset(ring, 0, TC_CALLS * sizeof(tc_call)); /* its pages touched now, not during the step */
    }
}

int MPI_Init(int *argc, char ***argv)
{
    start();
    return PMPI_Init(argc, argv);
}

int MPI_Init_thread(int *argc, char ***argv, int required, int *provided)
{
    start();
    return PMPI_Init_thread(argc, argv, required, provided);
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request *req)
{
    double t = now_us();
    int ret = PMPI_Isend(buf, count, type, dest, tag, comm, req);
    keep_msg(t, OP_ISEND, 0, nbytes(count, type), *req, dest, tag);
    return ret;
}

int MPI_Issend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request *req)
{
    double t = now_us();
    int ret = PMPI_Issend(buf, count, type, dest, tag, comm, req);
    keep_msg(t, OP_ISSEND, 0, nbytes(count, type), *req, dest, tag);
    return ret;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm, MPI_Request *req)
{
    double t = now_us();
    int ret = PMPI_Irecv(buf, count, type, source, tag, comm, req);
    keep_msg(t, OP_IRECV, 0, nbytes(count, type), *req, source, tag);
    return ret;
}

int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status)
{
    double t = now_us();
    MPI_Request before = *req; /* a completed request is set to MPI_REQUEST_NULL */
    int ret = PMPI_Test(req, flag, status);
    keep(t, OP_TEST, *flag, 0, before);
    return ret;
}

int MPI_Iprobe(int source, int tag, MPI_Comm comm, int *flag, MPI_Status *status)
{
    double t = now_us();
    int ret = PMPI_Iprobe(source, tag, comm, flag, status);
    keep(t, OP_IPROBE, *flag, 0, MPI_REQUEST_NULL);
    return ret;
}

int MPI_Wait(MPI_Request *req, MPI_Status *status)
{
    double t = now_us();
    MPI_Request before = *req;
    int ret = PMPI_Wait(req, status);
    keep(t, OP_WAIT, 1, 0, before);
    return ret;
}

int MPI_Barrier(MPI_Comm comm)
{
    double t = now_us();
    int ret = PMPI_Barrier(comm);
    keep(t, OP_BARRIER, 0, 0, MPI_REQUEST_NULL);
    return ret;
}

/* What keep() adds to a call: two clock reads and a record, timed over many. */
static double own_cost_us(void)
{
    enum { N = 20000 };
    tc_call *scratch = calloc(64, sizeof(tc_call));
    if (!scratch)
        return 0.0;
    tc_call *saved = ring;
    long saved_next = next;
    ring = scratch;
    double t0 = now_us();
    for (int i = 0; i < N; i++) {
        double t = now_us();
        next &= 63;
        keep(t, 0, 0, 0, MPI_REQUEST_NULL);
    }
    double cost = (now_us() - t0) / N;
    ring = saved;
    next = saved_next;
    free(scratch);
    return cost;
}

int MPI_Finalize(void)
{
    const char *dir = getenv("TILECAST_MPI_CALLS_DIR");
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (dir && ring) {
        char path[4096];
        snprintf(path, sizeof path, "%s/calls-%d.bin", dir, rank);
        double cost = own_cost_us();
        FILE *f = fopen(path, "wb");
        if (f) {
            int64_t n = next < TC_CALLS ? next : TC_CALLS;
            long first = next < TC_CALLS ? 0 : (next & (TC_CALLS - 1));
            fwrite(&n, sizeof n, 1, f);
            fwrite(&cost, sizeof cost, 1, f);
            fwrite(ring + first, sizeof(tc_call), (size_t)(n - first), f);
            if (first)
                fwrite(ring, sizeof(tc_call), (size_t)first, f);
            fclose(f);
        }
    }
    return PMPI_Finalize();
}
