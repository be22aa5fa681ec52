"""Pure ODB core (standard library only): the batching config, budget math, grouping, the
DGAP alignment rule, its wire format, the grouping window, loss-weight algebra, the
multi-rank simulator, offline planners and the bucket optimizer. Communication enters as a
callable (:data:`~odb_lightning.core.window.Exchange`), so the same code runs under Gloo
and in one process for many simulated ranks."""
