"""zoo.recipes: Lightning systems, the command line and sweeps. Imports Lightning; not imported by ``import zoo``."""
