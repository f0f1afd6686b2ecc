"""The backward schedules the training loop drives, side by side behind one interface.

`base.Schedule` is everything the loop asks of a schedule; `registry.build` picks one
from the worker's configuration: `standard` (DDP), `spb` (structured partial backprop's
per-stage exchange), `ooo` (out-of-order backprop: reverse first-k across ranks, the
deferred weight gradients of a single device) and `pipeline` (one stage per rank).
"""
