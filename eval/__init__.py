"""zoo.eval: measuring and storing (profiling, benchmarks, the results database). It never trains."""
