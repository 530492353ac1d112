/* tilecast's StarPU-MPI glue: every rank registers every tile (tag = tile id, owner rank) and submits the
 * whole graph in order with starpu_mpi_task_insert, which runs each task on the owner of what it writes and
 * moves tiles between ranks. Codelets and kernels are those of starpu_glue.c (tcs_set_kernels), linked into
 * the same extension. */
#ifndef TILECAST_STARPU_MPI_GLUE_H
#define TILECAST_STARPU_MPI_GLUE_H

#include <stdint.h>
#include <stddef.h>

/* Start StarPU with a policy and ncpus CPU workers, then StarPU-MPI (initialising MPI); 0 or an error. */
int tcsm_start(const char *sched, int ncpus);
/* 1 when StarPU-MPI's progress thread runs CPU worker 0 itself (STARPU_MPI_DRIVER_CALL_FREQUENCY > 0 at
 * tcsm_start): tcsm_submit then keeps it polling until tcsm_wait_all (see starpu_mpi_glue.c). */
int tcsm_progress_drives_worker(void);
/* Shut StarPU-MPI (MPI_Finalize) and StarPU down. */
void tcsm_stop(void);
int tcsm_rank(void);
int tcsm_size(void);
/* Register n tiles: a tile this rank owns in place at ptrs[i], another with no home buffer (StarPU allocates
 * it when it arrives); MPI tag = tile id, rank = owner[i]. */
int tcsm_register(int64_t n, const uint64_t *ptrs, const int64_t *nelem, const int64_t *elemsize,
                  const int32_t *owner, void **handles);
void tcsm_unregister(int64_t n, void **handles);
/* Submit the whole graph in order with starpu_mpi_task_insert (priority: per task, or NULL). For the tasks
 * this rank runs, out_start/out_end get StarPU's profiling times (microseconds, starpu_timing_now's clock,
 * CLOCK_MONOTONIC: comparable between processes of one machine) and out_worker the worker; others keep
 * their values. Returns the tasks inserted; *err gets 0 or the first insertion error. */
int64_t tcsm_submit(int64_t n_tasks, const int16_t *kernel, const int64_t *param_ptr, const double *params,
                    const int64_t *acc_ptr, const int32_t *acc_tile, const int8_t *acc_mode, void **handles,
                    const int32_t *priority, double *out_start, double *out_end, int32_t *out_worker, int *err);
/* From the next tcsm_submit on, out[0] gets starpu_timing_now (microseconds) before the first insertion and
 * out[i + 1] just after task i's starpu_mpi_task_insert returned (out: n_tasks + 1 entries; NULL: stop). A clock
 * read per task (CLOCK_MONOTONIC through the vDSO, tens of ns) beside the microseconds an insertion takes. */
void tcsm_record_submit(double *out);
/* Wait for every task and communication of every rank (starpu_mpi_wait_for_all); returns starpu_timing_now. */
double tcsm_wait_all(void);
/* MPI barrier over the ranks (starpu_mpi_barrier); returns starpu_timing_now just after it. */
double tcsm_barrier(void);
/* CLOCK_MONOTONIC minus starpu_timing_now, in us, read back to back: the ranks of one host share the
   monotonic clock, so this puts every rank's trace on one time base. */
double tcsm_clock_offset_us(void);
/* Drop every received copy (StarPU-MPI's cache), e.g. after tiles were rewritten outside tasks. */
void tcsm_flush_cache(void);
/* Bytes this rank sent to each rank so far (needs STARPU_COMM_STATS=1); out has tcsm_size() entries. */
void tcsm_comm_amounts(size_t *out);
/* The priority range of the running policy. */
void tcsm_priority_range(int *lo, int *hi);
/* Tasks this rank has executed so far. */
int64_t tcsm_executed(void);

/* Ping-pong of rank 0 with rank 1 (other ranks wait): for each of nsizes message sizes (bytes, at least 8),
 * 10 unrecorded then reps recorded round trips; rank 0 writes each round trip's seconds to
 * out_s[i * reps + r]. raw = 1: plain MPI_Send/MPI_Recv, before tcsm_start (MPI is initialised here and
 * finalised by tcsm_stop); raw = 0: starpu_mpi_send/starpu_mpi_recv of a registered vector, after
 * tcsm_start. 0 or an error. */
int tcsm_pingpong(int raw, int64_t nsizes, const int64_t *nbytes, int reps, double *out_s);

#endif
