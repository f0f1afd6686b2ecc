"""JigSaw HTTP API, its Python client and the `jigsaw` CLI."""
