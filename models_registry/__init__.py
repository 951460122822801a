"""Model catalog, Hub downloads, compatibility and memory-fit checks. Never imports Qt."""
