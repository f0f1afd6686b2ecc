"""An example user trial, shipped with its job: see trial.py, and ../spirals.yaml."""
