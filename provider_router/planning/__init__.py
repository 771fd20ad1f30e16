"""Before money is spent: the plan of datasets, prompt files, workloads, projections."""
