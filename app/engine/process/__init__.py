"""The engine in its own process: the messages (:mod:`.protocol`), the host that runs the engine
(:mod:`.host`) and the client the UI, the CLI and the server use (:mod:`.client`)."""
