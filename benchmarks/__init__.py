"""Benchmarks and issue reproductions that measure (speed, memory, MACs, the results database's overhead).

Not part of the installed ``zoo`` package: run each from the repository root as ``python -m benchmarks.<name>``
(README.md here lists them). They may import anything; nothing in zoo/, layers/, eval/, datasets/ or recipes/
imports them.
"""
