"""OmniRT: a gRPC-first serving runtime for generative models (SDK; client added later)."""

__version__ = "0.1.0"
