"""Runtime pieces both ops share: launching compiled kernels directly (:mod:`.direct`), chaining an op's
kernels by programmatic dependent launch (:mod:`.pdl`), device queries and the current device
(:mod:`.device`), the Triton/Gluon version gates (:mod:`.versions`), and what the eager autograd Functions
share (:mod:`.autograd`). Nothing here imports an op."""
