"""What the control plane and the worker agents share and neither owns: the job spec,
what an SPB configuration means, the agent protocol, GPU slots and JIGSAW_HOME.

Nothing here imports the scheduler, the API or the agent.
"""

# The distribution's version (pyproject.toml reads it from here): the agent reports it also
# when it runs from a source checkout that was never pip-installed.
__version__ = "0.1.0"
