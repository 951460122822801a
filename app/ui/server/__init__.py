"""The app's local API: the loaded pair served as ``tandem serve`` does, and its dialog."""
