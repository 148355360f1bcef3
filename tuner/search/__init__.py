"""What to search: the space, its bounds, the model, the workload, objectives."""
