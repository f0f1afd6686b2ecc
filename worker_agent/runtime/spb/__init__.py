"""Structured partial backprop (SPB) in the training runtime.

What a configuration means (depths, contributors, costs) lives in `jigsaw.spb`; this
package carries it out on a real model: `stages` cuts the model and marks what a worker
trains, `exchange` averages each stage's gradient over its contributors only,
`activations` counts what autograd saves per stage, `profiler` measures a workload's
per-stage costs and `efficiency` its statistical price.
"""
