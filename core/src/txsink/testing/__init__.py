"""Test support for txsink and for backend packages.

:mod:`txsink.testing.conformance` is the suite every backend must pass against a
live instance of its system; :mod:`txsink.testing.memory` is an in-memory backend
for testing the core itself.
"""
