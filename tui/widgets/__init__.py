"""Widgets of the chat screen: conversation, prompt input, status bar, chat list."""
