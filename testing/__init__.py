"""Test tooling that the tests (``tests/``) and the studies (``experiments/``) share, kept
out of the wheel: only a source checkout runs it (``pythonpath`` in ``pyproject.toml``
puts the checkout's root on the path).

* :mod:`testing.harness`: the multi-rank ``ODBLoader`` harness, the fault tools and the
  process probes.
* :mod:`testing.fixtures`: the pytest fixtures of both test trees (process-group teardown,
  the Qwen tokenizer), imported by ``tests/conftest.py`` and ``experiments/tests/conftest.py``.

It imports the package and third-party libraries, never ``experiments`` or ``tests``
(``tests/unit/test_layers.py`` checks it).
"""
