"""Helpers shared by the test suites: real servers, tiny trainers, dependency gates."""
