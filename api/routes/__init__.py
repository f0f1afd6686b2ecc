"""HTTP routes: parse, call scheduler.models in one transaction, map errors."""
