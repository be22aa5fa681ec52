"""Fixtures of the studies' tests: the same process-group teardown and Qwen tokenizer as
``tests/`` (:mod:`testing.fixtures`). These tests check the studies' own code (their
plans, arms, reports and command lines); the package's tests live in ``tests/``."""

from __future__ import annotations

from testing.fixtures import no_leftover_process_group, tokenizer

__all__ = ["no_leftover_process_group", "tokenizer"]
