"""Training a model for many steps on StarPU: the loop (:mod:`.loop`: batches,
checkpoints, validation, signals) and the validation loss (:mod:`.evaluation`)."""
