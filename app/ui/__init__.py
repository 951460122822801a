"""The desktop app (Qt). Nothing outside ``app.ui`` imports Qt; ``app.ui`` talks to the engine only
through :class:`app.engine.EngineClient`."""
