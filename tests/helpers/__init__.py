"""Helpers shared by test modules (``pythonpath`` in ``pyproject.toml`` puts ``tests/`` on
the path, so they import as ``helpers.<module>``). What the studies share with the tests
lives in :mod:`testing` instead. Tests that start their own Python processes keep the
root and ``tests/`` on the children's path (torchrun: ``PYTHONPATH``; a
forkserver inherits ``sys.path``)."""
