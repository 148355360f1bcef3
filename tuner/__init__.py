"""tuner: adaptive auto-tuning of LLM inference server knobs with Optuna."""

__version__ = "0.1.0"
