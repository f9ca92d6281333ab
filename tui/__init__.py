"""`tandem chat`: the Textual terminal chat.

Layout: `app.py` (the App), `backend.py` (the ChatBackend seam: in-process engine or an
OpenAI-compatible server), `store.py` (SQLite chats), `keymap.py` (bindings with ids and TOML
overrides), `widgets/` and `screens/`.
"""
