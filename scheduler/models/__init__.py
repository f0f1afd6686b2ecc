"""The store: the only code that queries or writes tables (besides orm.py and db.py), for
the API, the CLI, the scheduler loop and the agents' endpoint.

Each function takes a Session and leaves committing to the caller (one transaction per
request or scheduler step).
"""
