"""The studies: one package per study, each run from the repository root as
``python -m experiments.<study>.run`` (see the README next to each script). Beside them,
``common`` (the ``train.py`` runner, results meta, bench lock) and ``tests`` (the tests of
the studies' own code, in the default pytest run). The multi-rank harness and the fault
tools that the studies share with the tests are in ``testing/``, beside this folder."""
