"""Trace-driven simulation of the scheduler: the real policies over simulated time."""
