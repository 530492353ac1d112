/* The time of a disk transfer issued as StarPU 1.3.10's unistd disk backend issues it
 * (src/core/disk_ops/unistd/disk_unistd_global.c: one glibc aio_write/aio_read of a whole tile on its own
 * file, starpu_unistd_global_async_write/_read; completion found by polling aio_error,
 * starpu_unistd_global_test_request), while threads spin on the cores as StarPU's CPU workers do
 * (Debian's build has STARPU_NON_BLOCKING_DRIVERS: a worker waiting for a transfer loops in
 * _starpu_wait_data_request_completion -> _starpu_datawizard_progress with a "rep; nop" between polls and
 * never sleeps or yields).
 *
 * tc_aio_wait(workers, n, bytes, dir, t): with workers >= 1 the calling thread is pinned to CPU 0 and spins
 * on aio_error, and workers - 1 more threads spin pinned to CPUs 1, 2, ...; with workers 0 the calling thread
 * blocks in aio_suspend. n transfers each way on min(n, 64) files made up front (StarPU keeps at most 64
 * open: MAX_OPEN_FILES), then a plain pwrite and pread of each for reference. t receives 4 x n seconds:
 * aio_write, aio_read, pwrite, pread. Returns 0, or an errno.
 */
#define _GNU_SOURCE
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;

static void pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu % CPU_SETSIZE, &s);
	pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *spin(void *arg)
{
	pin((int)(intptr_t)arg);
	while (!stop)
		__asm__ __volatile__("rep; nop");
	return NULL;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + 1e-9 * t.tv_nsec;
}

static int one_aio(int fd, void *buf, size_t size, int write, int spinning, double *seconds)
{
	struct aiocb cb;
	memset(&cb, 0, sizeof cb);
	cb.aio_fildes = fd;
	cb.aio_buf = buf;
	cb.aio_nbytes = size;
	cb.aio_lio_opcode = LIO_NOP;
	const double t0 = now();
	if ((write ? aio_write(&cb) : aio_read(&cb)) < 0)
		return errno;
	if (spinning) {
		while (aio_error(&cb) == EINPROGRESS)
			__asm__ __volatile__("rep; nop");
	} else {
		const struct aiocb *l[1] = {&cb};
		while (aio_error(&cb) == EINPROGRESS)
			aio_suspend(l, 1, NULL);
	}
	*seconds = now() - t0;
	return aio_return(&cb) == (ssize_t)size ? 0 : EIO;
}

int tc_aio_wait(int workers, int n, int64_t bytes, const char *dir, double *t)
{
	const size_t size = (size_t)bytes;
	const int nfiles = n < 64 ? n : 64;
	int fds[64], err = 0, made = 0;
	void *buf = NULL;
	pthread_t th[256];
	int extra = 0;
	cpu_set_t before;
	pthread_getaffinity_np(pthread_self(), sizeof before, &before);
	if (posix_memalign(&buf, 4096, size))
		return ENOMEM;
	memset(buf, 1, size);
	char path[4096];
	for (; made < nfiles; made++) { /* one file per tile, made once (starpu_unistd_global_alloc) */
		snprintf(path, sizeof path, "%s/.tilecast-aio-XXXXXX", dir);
		fds[made] = mkstemp(path);
		if (fds[made] < 0) {
			err = errno;
			goto out;
		}
		unlink(path);
		if (ftruncate(fds[made], size) < 0) {
			err = errno;
			made++;
			goto out;
		}
	}
	stop = 0;
	if (workers >= 1)
		pin(0);
	for (; extra < workers - 1 && extra < 256; extra++)
		pthread_create(&th[extra], NULL, spin, (void *)(intptr_t)(extra + 1));
	usleep(20000);
	for (int i = 0; i < n && !err; i++) {
		err = one_aio(fds[i % nfiles], buf, size, 1, workers >= 1, &t[i]);
		if (!err)
			err = one_aio(fds[i % nfiles], buf, size, 0, workers >= 1, &t[n + i]);
	}
	for (int i = 0; i < n && !err; i++) {
		double t0 = now();
		if (pwrite(fds[i % nfiles], buf, size, 0) != (ssize_t)size)
			err = EIO;
		double t1 = now();
		if (pread(fds[i % nfiles], buf, size, 0) != (ssize_t)size)
			err = EIO;
		t[2 * n + i] = t1 - t0;
		t[3 * n + i] = now() - t1;
	}
	stop = 1;
	for (int i = 0; i < extra; i++)
		pthread_join(th[i], NULL);
	pthread_setaffinity_np(pthread_self(), sizeof before, &before);
out:
	for (int i = 0; i < made; i++)
		close(fds[i]);
	free(buf);
	return err;
}
