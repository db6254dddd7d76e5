"""Helpers shared by the test suites (broker process, frame builders)."""
