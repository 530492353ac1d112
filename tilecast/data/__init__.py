"""What a training run reads and keeps on disk: the byte corpus and its batches (:mod:`.corpus`), and
checkpoints, one file (:mod:`.checkpoint`) or one shard per StarPU-MPI rank (:mod:`.mpi_checkpoint`).
Nothing here knows StarPU or the training loop, so both the loop and the StarPU-MPI ranks use it."""
