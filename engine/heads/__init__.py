"""Trained draft heads that reuse the target's own features (EAGLE-style), and how they are stored."""
