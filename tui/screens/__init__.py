"""Modal screens: help, per-chat settings, small dialogs."""
