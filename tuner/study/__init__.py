"""The Optuna study: sampler, storage, objective, trial record, budget, workers."""
