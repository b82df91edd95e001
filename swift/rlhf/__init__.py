"""Preference-alignment losses: one file per algorithm, pure tensor functions."""
