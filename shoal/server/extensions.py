"""Subsystems that attach to the broker through its start/stop/disconnect hooks.

Importing this module registers them; ``shoal serve`` imports it before starting.
"""
