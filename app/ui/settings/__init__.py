"""The Settings dialog and its drafting-history box."""
