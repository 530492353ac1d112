/* tilecast's StarPU glue: one session at a time, whole graphs submitted from C.
 *
 * The kernels themselves live in the separate kernels extension
 * (tilecast/kernels/c); Python hands their addresses to tcs_set_kernels so
 * that StarPU codelets call exactly the functions the microbenchmarks time.
 */
#ifndef TILECAST_STARPU_GLUE_H
#define TILECAST_STARPU_GLUE_H

#include <stdint.h>

/* Scheduling policies this StarPU offers; fills up to max entries, returns the total. */
int tcs_policies(const char **names, const char **descs, int max);
int tcs_max_cpus(void);

/* Start StarPU (paused) with a policy and a number of CPU workers; 0 or -errno. */
int tcs_start(const char *sched, int ncpus);
void tcs_stop(void);
void tcs_pause(void);
void tcs_resume(void);
int tcs_nworkers(void);
int tcs_worker_node(int worker);
int tcs_worker_name(int worker, char *out, int len);
/* The priority range the running policy declares (starpu_sched_get_min/max_priority). */
void tcs_priority_range(int *min_prio, int *max_prio);

/* Codelets (with history-based perfmodels named after the kernels) for n kernels. */
int tcs_set_kernels(int n, const uint64_t *fns, const char *const *names, const int *nbuffers);

/* Register n CPU buffers in place as vector handles; unregister them (data stays in place). */
int tcs_register(int64_t n, const uint64_t *ptrs, const int64_t *nelem, const int64_t *elemsize, void **handles);
void tcs_unregister(int64_t n, void **handles);
/* Re-register the tiles listed in idx (their buffers changed): unregister the old handle, register anew. */
int tcs_reregister_at(int64_t n_idx, const int64_t *idx, const uint64_t *ptrs, const int64_t *nelem,
                      const int64_t *elemsize, void **handles);

/* Submit a whole graph in order. flags: TCS_DRY (empty codelets, no perfmodels).
 * priority: per-task StarPU priority (within tcs_priority_range), or NULL for the default 0.
 * Per-task start/end (seconds from the submission start) and worker arrive in
 * out_start/out_end/out_worker as tasks finish. Returns the number of tasks
 * submitted; *err gets 0 or the first submission error. */
#define TCS_DRY 1
#define TCS_SUBMIT_PAUSED 2
int64_t tcs_submit(int64_t n_tasks, const int16_t *kernel, const int64_t *param_ptr, const double *params,
                   const int64_t *acc_ptr, const int32_t *acc_tile, const int8_t *acc_mode, void **handles,
                   const int32_t *priority, int flags, double *out_start, double *out_end, int32_t *out_worker, int *err);
/* Wait up to timeout_ms for the submitted tasks; returns how many have finished. */
int64_t tcs_wait(int timeout_ms);
/* From now on, remaining tasks of the current run skip their kernels (after Ctrl-C). */
void tcs_abort(void);
/* Wait for every task, release them; returns the run's wall time in seconds. */
double tcs_finish(void);
/* Seconds the last run's submission loop took (the submitting thread's time for the graph). */
double tcs_submit_seconds(void);
/* The last run's marks, seconds on CLOCK_MONOTONIC (Python's perf_counter): submission start and end, the
 * last task's callback, the waiting thread's wake-up, the workers paused, StarPU's wait for all returned. */
void tcs_marks(double *out);

/* StarPU's own cost: n empty tasks over the same handles, no callbacks, profiling on or off. */
double tcs_baseline(int64_t n_tasks, const int64_t *acc_ptr, const int32_t *acc_tile, const int8_t *acc_mode,
                    void **handles, int profiling);

/* StarPU-managed tiles (home node -1: StarPU allocates them and may evict them to a disk node).
 * Zero-sized tiles get a NULL handle. Unregistering drops the data (no copy back). */
int tcs_register_managed(int64_t n, const int64_t *nelem, const int64_t *elemsize, void **handles);
void tcs_unregister_managed(int64_t n, void **handles);
/* Copy into / out of tiles idx[0..n) through starpu_data_acquire on main memory (W or R), one tile at a
 * time; src/dst[k] is the host address of tile idx[k]'s bytes. 0 or the first StarPU error. */
int tcs_tiles_write(int64_t n, const int64_t *idx, const uint64_t *src, void **handles);
int tcs_tiles_read(int64_t n, const int64_t *idx, const uint64_t *dst, void **handles);
/* A disk memory node in directory dir, of at most size bytes; its node id, or -1. direct 0: StarPU's unistd
 * backend (every tile through the page cache); 1: the same with O_DIRECT for tiles of whole pages
 * (c/disk_ops.c). */
int tcs_disk_register(const char *dir, int64_t size, int direct);
/* The disk node's files created so far: opened with O_DIRECT, and buffered (c/disk_ops.c). */
void tcs_disk_files(int64_t *direct, int64_t *buffered);
/* Bytes and transfers from node src to node dst since the last call (StarPU's bus profiling). */
int tcs_bus_bytes(int src, int dst, int64_t *bytes, int64_t *count);

#endif
