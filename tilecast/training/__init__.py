"""Training a model for many steps on StarPU or the numpy reference: the loop (:mod:`.loop`: batches,
checkpoints, validation, signals) and the validation loss (:mod:`.evaluation`)."""
