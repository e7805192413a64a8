"""Scaling: fit scaling laws to evaluated runs and predict a target (`scaling_fit`), and a training's
predicted loss curve (`prediction`)."""
