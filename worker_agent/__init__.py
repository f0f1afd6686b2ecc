"""JigSaw worker agent and training runtime (arrives with the worker-agent issue)."""
