"""Evaluation steps: evaluate, task_eval and its tasks, following a training checkpoint by checkpoint."""
