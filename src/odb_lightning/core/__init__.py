"""Pure ODB core (standard library only): budget math, grouping, the DGAP alignment
protocol, its wire format, the grouping window, loss-weight algebra, the multi-rank
simulator, offline planners and the bucket optimizer.

Communication enters as a callable ``exchange(list[int]) -> list[list[int]]`` so the same
code runs under Gloo and in one process for 1..1024 simulated ranks.
"""
