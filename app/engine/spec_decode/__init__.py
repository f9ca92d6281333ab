"""Speculative decoding: proposers (n-gram prompt lookup, OpenAI Predicted Outputs), the
adaptive controller that sizes drafts from a measured step-time curve, and the speculator
that ties them to the engine's step. Verification and rollback live in the step's commit
(`app.engine.engine`)."""
