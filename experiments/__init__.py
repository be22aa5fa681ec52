"""The studies: one package per study, each run from the repository root as
``python -m experiments.<study>.run`` (see the README next to each script). Beside them,
``common`` (the ``train.py`` runner, results meta, bench lock) and ``harness`` (the
multi-rank harness and fault tools the studies share with the tests)."""
