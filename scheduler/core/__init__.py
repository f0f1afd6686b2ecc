"""The pure core of the scheduler: what policies and the simulator compute, with no store."""
