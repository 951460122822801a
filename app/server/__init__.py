"""The local OpenAI-compatible API: editors, notebooks and agents get the engine's speed.

``tandem serve`` runs it on its own; the app can serve the pair its window has loaded. Built on
FastAPI, uvicorn and sse-starlette, over the one engine client the app and the CLI use. No Qt here.
"""
