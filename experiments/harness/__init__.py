"""What the tests and the studies share: the multi-rank harness and the fault tools. It
lives beside the studies, not in the package: only a source checkout runs it.

* :mod:`~experiments.harness.ranks`: a multi-rank process harness for ``ODBLoader``
  (each rank a real process in a gloo default group), over the datasets and shards of
  :mod:`~experiments.harness.datasets`.
* :mod:`~experiments.harness.fault_matrix`: the loader-level fault matrix at 2 ranks.
* :mod:`~experiments.harness.fault_injection` and
  :mod:`~experiments.harness.train_faults`: faults injected into a real ``train.py``
  run of this checkout.
* :mod:`~experiments.harness.processes`: process-tree probes (descendants, listening
  sockets, memory) and bounded waits for processes to exit.
* :mod:`~experiments.harness.sharded_setup`: Lightning's FSDP2 setup on 2 CPU ranks,
  stopped before the first batch.
"""
