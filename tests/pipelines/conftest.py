"""Pipeline tests use the session's tiny model and Ray cluster (tests/conftest.py)."""
