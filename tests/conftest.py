import os

# Keep BLAS to one thread per process in tests: results must not depend on the machine's core count.
os.environ.setdefault("OMP_NUM_THREADS", "1")
