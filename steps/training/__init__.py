"""Training steps: train_moe, its Levanter config and hooks, the models, checkpoints, spikes."""
