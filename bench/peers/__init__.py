"""Peers of the engine for bench/mfu.py: what a user would train the same model with instead."""
