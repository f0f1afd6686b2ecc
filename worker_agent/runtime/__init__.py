"""The training runtime: the loop the platform runs around a user's `Trial`.

One worker process per GPU slot runs `loop.run_worker`; the node agent spawns it through
`python -m worker_agent.runtime.worker` and talks to it over the protocol in `control`.
"""
