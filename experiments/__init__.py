"""The studies: one package per study, each run from the repository root as
``python -m experiments.<study>.run`` (see the README next to each script)."""
