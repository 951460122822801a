"""What the views share and show: the session model, the app's settings, the conversation store, the
engine worker, saved secrets and paths. No view is imported here."""
