"""Test tooling shipped with the package, as ``torch.testing`` is: what the test suite and
the experiments both run.

* :mod:`~odb_lightning.testing.ranks`: a multi-rank process harness for ``ODBLoader``
  (each rank a real process in a gloo default group), over the datasets and shards of
  :mod:`~odb_lightning.testing.datasets`.
* :mod:`~odb_lightning.testing.fault_matrix`: the loader-level fault matrix at 2 ranks.
* :mod:`~odb_lightning.testing.fault_injection` and
  :mod:`~odb_lightning.testing.train_faults`: faults injected into a real ``train.py``
  run of a source checkout.
* :mod:`~odb_lightning.testing.processes`: process-tree probes (descendants, listening
  sockets, memory) and bounded waits for processes to exit.

Nothing else in the package imports it.
"""
