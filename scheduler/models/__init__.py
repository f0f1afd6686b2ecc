"""Database functions: the only code that queries or writes tables for the API and CLI.

Each function takes a Session and leaves committing to the caller (one transaction per
request or scheduler step).
"""
