"""An example user trial: see spirals.py, and spirals.yaml for the job that runs it."""
