"""What the tests and the studies share: the multi-rank harness and the fault tools.


* :mod:`~testing.harness.ranks`: a multi-rank process harness for ``ODBLoader``
  (each rank a real process in a gloo default group), over the datasets and shards of
  :mod:`~testing.harness.datasets`.
* :mod:`~testing.harness.fault_matrix`: the loader-level fault matrix at 2 ranks.
* :mod:`~testing.harness.fault_injection` and
  :mod:`~testing.harness.train_faults`: faults injected into a real ``train.py``
  run of this checkout.
* :mod:`~testing.harness.processes`: process-tree probes (descendants, listening
  sockets, memory) and bounded waits for processes to exit.
* :mod:`~testing.harness.sharded_setup`: Lightning's FSDP2 setup on 2 CPU ranks,
  stopped before the first batch.
* :mod:`~testing.harness.stop_marks`: a callback that marks a run's phases in time (step
  ends, validation starts, checkpoint saves), to time a stop.
"""
