"""JigSaw scheduler: the domain (database, job state machine, policies, round loop)."""
