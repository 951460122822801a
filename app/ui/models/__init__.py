"""The Models panel: the catalog, downloads, installed files, a custom pair and remote servers."""
