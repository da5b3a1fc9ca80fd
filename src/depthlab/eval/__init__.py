"""Evaluation: every scorer depthlab has, below train/, hf/ and analysis/ (it imports none of them)."""
