"""The scheduler's side of the worker agents: the gRPC service they dial, the dispatcher
that commands them, and the batched writer of what they report."""
