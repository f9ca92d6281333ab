"""`tandem chat`: the Textual terminal chat.

Layout: `app.py` (the App: layout, loading, streaming), `actions.py` (what the keys do,
typed against the `ChatHost` protocol of `host.py`), `session.py` (chat state, no Textual),
`client.py` (the `ChatClient` seam: in-process engine or an OpenAI-compatible server),
`store.py` (SQLite chats), `keymap.py` (bindings with ids and TOML overrides), `widgets/`
and `screens/`.
"""
