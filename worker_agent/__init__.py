"""JigSaw worker agent and training runtime."""
