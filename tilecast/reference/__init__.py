"""A graph executed in numpy: the tile buffers (:mod:`.tiles`), a training step's state in and out of them
(:mod:`.step`), the sequential reference executor (:mod:`.run`), and the check of a built step against
PyTorch/transformers (:mod:`.verify`, through the Hugging Face weight mappings :mod:`.hf_mapping` and
:mod:`.hf_mapping_llama`). The StarPU executor registers these same numpy tiles and checks its steps against
this reference; nothing here knows StarPU."""
