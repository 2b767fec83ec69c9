"""Peers of the engine for bench/train_mfu.py: what a user would train the same model with instead."""
