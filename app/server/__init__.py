"""OpenAI-compatible HTTP API over `AsyncEngine` (FastAPI + uvicorn); see `app.server.app`."""
