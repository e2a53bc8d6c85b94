"""The graded exercises (not part of the installed package): see exercises/exercises.toml and `minilin status`.

This file makes pytest import exercises/conftest.py as `exercises.conftest`, so that a run of
`pytest tests exercises` keeps tests/conftest.py importable as `conftest`.
"""
