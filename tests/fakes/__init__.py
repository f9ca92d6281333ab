"""Stand-ins for the hardware side of the engine: a tokenizer and runners without a model.

Tests run the real engine (`LLMEngine`, `AsyncEngine`) over these; nothing here fakes the
engine itself.
"""
