"""GGUF files: header and tokenizer metadata (local or over HTTP ranges) and vocabulary compatibility.

A leaf package: the engine and models_registry both import it; it imports neither.
"""
