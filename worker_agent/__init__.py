"""JigSaw worker agent and training runtime."""

# The distribution's version (pyproject.toml reads it from here): the agent reports it also
# when it runs from a source checkout that was never pip-installed.
__version__ = "0.1.0"
