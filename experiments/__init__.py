"""Experiments that train: reproductions, comparisons over seeds, overhead studies, the notebooks' data.

Not part of the installed ``zoo`` package: run each from the repository root as ``python -m experiments.<name>``
(README.md here lists them). They may import anything (recipes, datasets, Lightning); nothing in the package
imports them.
"""
