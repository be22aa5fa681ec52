"""Helpers shared by test modules (``pythonpath`` in ``pyproject.toml`` puts ``tests/`` on
the path, so they import as ``helpers.<module>``). What experiments share with the tests
lives in :mod:`experiments.harness` instead. Tests that start their own Python processes
keep the root and ``tests/`` on the children's path (torchrun: ``PYTHONPATH``; a
forkserver inherits ``sys.path``)."""
