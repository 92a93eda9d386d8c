"""The benchmarks' source model and workers; used by nothing else."""
